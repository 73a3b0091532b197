//! The lobby: nodes admitted while the others join wait here, heartbeated and read
//! (nothing decoded, unless the node closes: then its `failed`, if it sent one, says
//! why) so that one that drops is seen at once and its slot freed.

use std::time::{Duration, Instant};

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{mpsc, oneshot};

use super::listener::Joined;
use super::stream::PeerStream;
use super::timing::{heartbeat_frame, until_next_beat};

/// Most bytes a node waiting for the run to start may send before it is read by
/// its peer (its `ready` and heartbeats are a few hundred): past it the lobby
/// stops reading, and the socket's buffers hold the rest.
const LOBBY_BYTES: usize = 1 << 20;

/// A node admitted during the join phase, waiting for the others: its connection
/// is read (into a buffer, nothing decoded) so that a node that drops is seen at
/// once and its slot freed for another.
pub(crate) struct Waiting {
    /// Its slot.
    pub(crate) index: usize,
    stop: oneshot::Sender<()>,
    back: oneshot::Receiver<(Joined, Vec<u8>)>,
}

/// Watches `j` until [`Waiting::start`], sending it a heartbeat every `every` (on
/// the beats of the clock the peers share) so that a node admitted early is not left
/// in silence while the others join; if its connection closes first, sends
/// `(index, reason)` to `gone` (the connection is then dropped). `buf`: bytes of it
/// already read (empty unless it waited before).
pub(crate) fn wait_in_lobby(
    mut j: Joined,
    mut buf: Vec<u8>,
    every: Duration,
    gone: mpsc::UnboundedSender<(usize, String)>,
) -> Waiting {
    let (stop, mut stop_rx) = oneshot::channel();
    let (back_tx, back) = oneshot::channel();
    let index = j.index;
    actix_rt::spawn(async move {
        let beat = heartbeat_frame();
        // Bytes of the current heartbeat not written yet (its tail): a frame is
        // written whole before another begins, and before the connection is handed on.
        let mut unsent = 0usize;
        // A heartbeat written into a TLS session and not yet flushed to the socket.
        let mut flushing = false;
        let mut chunk = [0u8; 4096];
        let first = tokio::time::Instant::now() + until_next_beat(Instant::now(), every);
        let mut beats = tokio::time::interval_at(first, every);
        beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let reason = loop {
            // Every branch is cancel-safe: a read or write either moved bytes or did not.
            // The start wins over bytes or an end that arrive at the same time. Past
            // [`LOBBY_BYTES`] the lobby stops reading (the socket's buffers hold the rest).
            let tail = &beat[beat.len() - unsent..];
            let reading = buf.len() < LOBBY_BYTES;
            let io = poll_fn(|cx| lobby_io(&mut j.stream, cx, tail, flushing, reading, &mut chunk));
            tokio::select! {
                biased;
                _ = &mut stop_rx => break None,
                _ = beats.tick(), if unsent == 0 && !flushing => unsent = beat.len(),
                ev = io => match ev {
                    LobbyIo::Wrote(n) => {
                        unsent -= n;
                        flushing = unsent == 0;
                    }
                    LobbyIo::Flushed => flushing = false,
                    LobbyIo::Read(0) => break Some(match failed_reason(&buf) {
                        Some(why) => format!("failed: {why}"),
                        None => "closed its connection".to_string(),
                    }),
                    LobbyIo::Read(n) => buf.extend_from_slice(&chunk[..n]),
                    LobbyIo::Lost(e) => break Some(format!("connection lost: {e}")),
                }
            }
        };
        // A heartbeat begun is finished before the connection is handed on; a peer
        // that does not take a few bytes within four intervals is gone.
        let reason = match reason {
            None if unsent > 0 || flushing => {
                let rest = &beat[beat.len() - unsent..];
                let finish = async {
                    j.stream.write_all(rest).await?;
                    j.stream.flush().await
                };
                match tokio::time::timeout(every * 4, finish).await {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(format!("connection lost: {e}")),
                    Err(_) => Some("does not read what the trainer sends".to_string()),
                }
            }
            r => r,
        };
        match reason {
            None => {
                let _ = back_tx.send((j, buf));
            }
            Some(reason) => {
                let _ = gone.send((index, reason));
            }
        }
    });
    Waiting { index, stop, back }
}

/// What one turn of a waiting node's connection did.
enum LobbyIo {
    /// Bytes of the heartbeat written (into the socket, or a TLS session).
    Wrote(usize),
    /// The TLS session's records of the heartbeat are in the socket.
    Flushed,
    /// Bytes read into the scratch buffer (0: the node closed).
    Read(usize),
    /// The connection failed.
    Lost(io::Error),
}

/// Writes `tail` (a heartbeat's unsent bytes) or, once it is written, flushes the
/// session (`flushing`), and reads into `chunk` (when `reading`), whichever is ready
/// first; plain and TLS alike, through one borrow of the stream.
fn lobby_io(
    s: &mut PeerStream,
    cx: &mut Context<'_>,
    tail: &[u8],
    flushing: bool,
    reading: bool,
    chunk: &mut [u8],
) -> Poll<LobbyIo> {
    if !tail.is_empty() {
        match Pin::new(&mut *s).poll_write(cx, tail) {
            Poll::Ready(Ok(0)) => return Poll::Ready(LobbyIo::Lost(io::ErrorKind::WriteZero.into())),
            Poll::Ready(Ok(n)) => return Poll::Ready(LobbyIo::Wrote(n)),
            Poll::Ready(Err(e)) => return Poll::Ready(LobbyIo::Lost(e)),
            Poll::Pending => {}
        }
    } else if flushing {
        match Pin::new(&mut *s).poll_flush(cx) {
            Poll::Ready(Ok(())) => return Poll::Ready(LobbyIo::Flushed),
            Poll::Ready(Err(e)) => return Poll::Ready(LobbyIo::Lost(e)),
            Poll::Pending => {}
        }
    }
    if reading {
        let mut rb = ReadBuf::new(chunk);
        match Pin::new(&mut *s).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => return Poll::Ready(LobbyIo::Read(rb.filled().len())),
            Poll::Ready(Err(e)) => return Poll::Ready(LobbyIo::Lost(e)),
            Poll::Pending => {}
        }
    }
    Poll::Pending
}

/// The reason of the `failed` frame among the whole frames of `buf`, if the node sent
/// one before it closed (a node that cannot build its workers says why, PROTOCOL.md §2).
/// `buf` is bounded by [`LOBBY_BYTES`] and comes from a node that proved the token; a
/// frame that does not decode ends the search.
fn failed_reason(buf: &[u8]) -> Option<String> {
    use rollout::message::FromNode;
    use rollout::wire::NodeFrame;
    let mut rest = buf;
    while let Some(prefix) = rest.first_chunk::<4>() {
        let len = usize::try_from(u32::from_be_bytes(*prefix)).ok()?;
        let body = rest.get(4..4usize.checked_add(len)?)?;
        if let NodeFrame::Message(FromNode::Failed { reason, .. }) = rollout::wire::decode::<NodeFrame>(body).ok()? {
            // The node's words, bounded and escaped for the join error that shows them.
            return Some(rollout::peer_text::bounded(&reason));
        }
        rest = &rest[4 + len..];
    }
    None
}

impl Waiting {
    /// The run starts: the connection back, with the bytes the node sent meanwhile
    /// (to be read before the socket's); `None` if it closed in the meantime (its
    /// `gone` message is then already sent).
    pub(crate) async fn start(self) -> Option<(Joined, Vec<u8>)> {
        let _ = self.stop.send(());
        self.back.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rollout::message::FromNode;
    use rollout::wire::{encode, NodeFrame};

    fn framed(f: &NodeFrame) -> Vec<u8> {
        encode(f, 1 << 20).expect("encode")
    }

    #[test]
    fn a_nodes_failed_frame_before_it_closed_is_its_reason() {
        let mut buf = framed(&NodeFrame::Heartbeat);
        buf.extend(framed(&NodeFrame::Message(FromNode::Failed {
            node: 0,
            reason: "cannot make env `X`".into(),
        })));
        assert_eq!(failed_reason(&buf).as_deref(), Some("cannot make env `X`"));
        assert_eq!(failed_reason(&framed(&NodeFrame::Heartbeat)), None);
        // A cut frame or garbage: no reason, no panic.
        assert_eq!(failed_reason(&buf[..buf.len() - 1]), None);
        assert_eq!(failed_reason(&[0xff, 0xff, 0xff, 0xff, 1]), None);
        assert_eq!(failed_reason(&[]), None);
    }

    #[test]
    fn a_waiting_nodes_long_reason_is_cut_and_escaped() {
        let long = framed(&NodeFrame::Message(FromNode::Failed {
            node: 0,
            reason: "\u{1b}[2J".repeat(100_000),
        }));
        let shown = failed_reason(&long).unwrap_or_default();
        assert!(shown.starts_with("\\u{1b}[2J"), "{shown}");
        assert!(shown.ends_with(" … (400000 bytes)"), "{shown}");
        assert!(shown.len() <= rollout::peer_text::MAX_PRINTED, "{} bytes", shown.len());
        assert!(!shown.contains('\u{1b}'), "{shown}");
    }
}
