//! Heartbeat deadlines, the same on both sides: a heartbeat goes out every
//! interval, and a peer heard from for longer than the timeout is gone.

use std::time::{Duration, Instant};

/// When to send a heartbeat and when the peer is gone. The shell fires
/// [`Liveness::tick`] every [`Liveness::interval`] and reports every frame it read
/// with [`Liveness::heard`].
#[derive(Clone, Debug)]
pub struct Liveness {
    interval: Duration,
    timeout: Duration,
    last_heard: Instant,
}

/// What a timer tick asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tick {
    /// Send a heartbeat.
    Heartbeat,
    /// The peer was silent for longer than the timeout (this long): it is gone.
    Silent(Duration),
}

impl Liveness {
    /// Heartbeats every `interval`, the peer gone after `timeout` of silence,
    /// counted from `now`.
    pub fn new(interval: Duration, timeout: Duration, now: Instant) -> Liveness {
        Liveness {
            interval,
            timeout,
            last_heard: now,
        }
    }

    /// How often the shell's timer fires [`Liveness::tick`].
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The silence after which the peer is gone.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A frame (any, even a bad one) came in at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    /// The timer fired at `now`.
    pub fn tick(&self, now: Instant) -> Tick {
        if now.saturating_duration_since(self.last_heard) > self.timeout {
            Tick::Silent(self.timeout)
        } else {
            Tick::Heartbeat
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_every_tick_until_the_peer_is_silent_past_the_timeout() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut l = Liveness::new(ms(100), ms(500), t0);
        assert_eq!(l.interval(), ms(100));
        assert_eq!(l.tick(t0 + ms(100)), Tick::Heartbeat);
        // Exactly the timeout is still alive; past it is not.
        assert_eq!(l.tick(t0 + ms(500)), Tick::Heartbeat);
        assert_eq!(l.tick(t0 + ms(501)), Tick::Silent(ms(500)));
        // Hearing anything starts the count again.
        l.heard(t0 + ms(450));
        assert_eq!(l.tick(t0 + ms(900)), Tick::Heartbeat);
        assert_eq!(l.tick(t0 + ms(951)), Tick::Silent(ms(500)));
        // A tick from before the last frame (timers are not exact) is no silence.
        assert_eq!(l.tick(t0), Tick::Heartbeat);
    }
}
