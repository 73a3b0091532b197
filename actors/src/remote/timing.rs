//! The leaf of remote/: how peers time their heartbeats and read and write frames
//! outside a connection's streams (the handshake, the lobby), used by both sides.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rollout::wire::{self, TrainerFrame, PREFIX_LEN};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Settings of a peer connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerTiming {
    /// How often a heartbeat goes out.
    pub(crate) heartbeat: Duration,
    /// Silence after which the peer is gone.
    pub(crate) timeout: Duration,
    /// Largest frame body.
    pub(crate) max_frame: usize,
}

/// How long from `now` to the next multiple of `every` on one clock shared by every
/// connection of the process: the trainer's heartbeats to all its nodes fall on the
/// same beats, so one wakeup sends them all (a timer per connection, each on its own
/// phase, woke the trainer, and every node behind it, once per node and interval).
/// Each connection still hears a heartbeat every `every`.
pub(crate) fn until_next_beat(now: Instant, every: Duration) -> Duration {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    beat_delay(*EPOCH.get_or_init(Instant::now), now, every)
}

/// From `now` to the next `epoch + k * every`.
fn beat_delay(epoch: Instant, now: Instant, every: Duration) -> Duration {
    let every_ns = every.as_nanos().max(1);
    let phase = now.saturating_duration_since(epoch).as_nanos() % every_ns;
    Duration::from_nanos(u64::try_from(every_ns - phase).unwrap_or(u64::MAX))
}

/// The encoded `heartbeat` frame, the same bytes every time: encoded once per process.
pub(crate) fn heartbeat_frame() -> Bytes {
    static FRAME: OnceLock<Bytes> = OnceLock::new();
    FRAME
        .get_or_init(|| Bytes::from(wire::encode(&TrainerFrame::Heartbeat, usize::MAX).unwrap_or_default()))
        .clone()
}

/// Reads one frame body straight from a stream (no read-ahead, so the stream can
/// be handed on intact after the handshake).
pub(crate) async fn read_frame(s: &mut (impl AsyncRead + Unpin), max: usize) -> Result<Vec<u8>, String> {
    let mut prefix = [0u8; PREFIX_LEN];
    s.read_exact(&mut prefix)
        .await
        .map_err(|e| format!("reading a frame: {e}"))?;
    let len = wire::body_len(prefix, max).map_err(|e| e.to_string())?;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)
        .await
        .map_err(|e| format!("frame cut short: {e}"))?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_fall_on_the_beats_of_one_clock_an_interval_apart() {
        let every = Duration::from_millis(1000);
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(
            beat_delay(epoch, epoch, every),
            every,
            "on a beat: the next is a whole interval away"
        );
        assert_eq!(
            beat_delay(epoch, epoch + ms(300), every),
            ms(700),
            "a connection started later: the same beat"
        );
        assert_eq!(
            beat_delay(epoch, epoch + ms(1002), every),
            ms(998),
            "a timer fired late does not drift"
        );
        assert_eq!(
            beat_delay(epoch + ms(5), epoch, every),
            every,
            "before the epoch: one interval"
        );
        let first = until_next_beat(Instant::now(), every);
        assert!(first > Duration::ZERO && first <= every, "{first:?}");
    }
}
