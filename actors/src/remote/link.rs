//! The write side of a connection: frames go to the socket at once when they are
//! small and nothing waits before them, else through a writer task.
//!
//! Writers never block an actor: encoding happens in the actor, large writes in
//! the task. A frame may be queued as several parts (headers, then tensors
//! straight from their memory); the task writes whatever is queued with one
//! vectored write, so parts cost no extra system call each. A small frame with
//! nothing queued before it (a `continue`, a heartbeat) is written by the sender
//! itself, without waiting for the task's turn on the thread: a trainer's
//! `continue` then leaves while the rest of that node's batch is still being read.
//! Dropping every sender ends the task, which closes the socket's write side.
//!
//! Over TLS every part goes through the task (a TLS session's bytes cannot be written
//! past it), which writes them vectored into the session and flushes the records to
//! the socket; at its end it closes the session (`close_notify`) and the write side.

use std::cell::Cell;
use std::io::IoSlice;
use std::rc::Rc;

use bytes::{Buf, Bytes};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

use super::stream::WriteSide;

/// Parts taken from the queue for one vectored write, at most.
const MAX_PARTS: usize = 64;

/// Parts up to this size may be written by the sender itself.
const DIRECT_MAX: usize = 4096;

/// How long the task's end may take to close a TLS session (its `close_notify` and
/// the socket's write side) when the peer does not read.
const TLS_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The writer task is gone (the connection failed, its error was reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriterGone;

/// The socket and what is waiting to be written to it, shared by the senders and
/// the task (all on one thread).
struct Shared {
    /// A plain socket's write half (a TLS session's is the task's alone: `None`).
    w: Option<OwnedWriteHalf>,
    /// Parts handed to the task and not written yet: while there are any, every
    /// part goes behind them, so bytes leave in the order they were sent.
    queued: Cell<usize>,
}

/// Sends a connection's frames (whole, prefix included, or one part after another).
#[derive(Clone)]
pub(crate) struct FrameSender {
    tx: mpsc::UnboundedSender<Bytes>,
    shared: Rc<Shared>,
}

impl FrameSender {
    /// Sends `part`: straight to the socket if it is small, nothing is queued and the
    /// socket takes all of it, else (what is left of it) through the writer task.
    pub(crate) fn send(&self, mut part: Bytes) -> Result<(), WriterGone> {
        let sh = &self.shared;
        if let Some(w) =
            sh.w.as_ref()
                .filter(|_| sh.queued.get() == 0 && !part.is_empty() && part.len() <= DIRECT_MAX)
        {
            // A real error here is met again, and reported, by the task.
            if let Ok(n) = w.try_write(&part) {
                if n == part.len() {
                    return Ok(());
                }
                part.advance(n);
            }
        }
        sh.queued.set(sh.queued.get() + 1);
        self.tx.send(part).map_err(|_| WriterGone)
    }
}

/// Starts the writer task and returns a sender for the connection's frames.
/// `on_error` is called once if a write fails. The task ends, after writing what
/// was queued, when every sender is dropped.
pub(crate) fn spawn_writer(
    w: WriteSide,
    on_error: impl FnOnce(String) + 'static,
) -> (FrameSender, actix_rt::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    let (plain, mut tls) = match w {
        WriteSide::Plain(w) => (Some(w), None),
        WriteSide::Tls(w) => (None, Some(w)),
    };
    let shared = Rc::new(Shared {
        w: plain,
        queued: Cell::new(0),
    });
    let sh = Rc::clone(&shared);
    let task = actix_rt::spawn(async move {
        let mut queued: Vec<Bytes> = Vec::with_capacity(MAX_PARTS);
        while let Some(first) = rx.recv().await {
            queued.push(first);
            while queued.len() < MAX_PARTS {
                match rx.try_recv() {
                    Ok(more) => queued.push(more),
                    Err(_) => break,
                }
            }
            let n = queued.len();
            let written = match (&sh.w, &mut tls) {
                (Some(w), _) => write_all_vectored(w, &mut queued).await,
                (None, Some(w)) => write_all_tls(w, &mut queued).await,
                (None, None) => Err(std::io::ErrorKind::NotConnected.into()),
            };
            if let Err(e) = written {
                on_error(format!("write failed: {e}"));
                return;
            }
            sh.queued.set(sh.queued.get().saturating_sub(n));
        }
        // Every sender is gone: dropping the last handle on a plain write half shuts
        // the socket's write side down; a TLS session is closed here.
        if let Some(mut w) = tls {
            let _ = tokio::time::timeout(TLS_CLOSE_WAIT, w.shutdown()).await;
        }
    });
    (FrameSender { tx, shared }, task)
}

/// The parts from `first` on that are still to be written, as slices for one vectored
/// write; `None` once every byte is written. Parts empty from the start count as
/// written (and a write of nothing would look like a closed socket): `first` moves past
/// them.
fn unwritten<'a>(parts: &'a [Bytes], first: &mut usize) -> Option<Vec<IoSlice<'a>>> {
    while *first < parts.len() && parts[*first].is_empty() {
        *first += 1;
    }
    (*first < parts.len()).then(|| parts[*first..].iter().map(|p| IoSlice::new(p)).collect())
}

/// `n` bytes of `parts[first..]` written: the parts advanced past them, the index of
/// the first part not written whole returned. `n` is at most what remains (a write
/// takes no more than it was given), so the index stays in bounds.
fn advance(parts: &mut [Bytes], mut first: usize, mut n: usize) -> usize {
    while n > 0 {
        let p = &mut parts[first];
        let take = n.min(p.len());
        p.advance(take);
        n -= take;
        if p.is_empty() {
            first += 1;
        }
    }
    first
}

/// Writes every byte of `parts` into a TLS session in order, vectored (the session
/// takes as much as its buffer holds), then flushes its records to the socket; `parts`
/// is empty afterwards.
async fn write_all_tls(
    w: &mut tokio::io::WriteHalf<super::stream::Tls>,
    parts: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    let mut first = 0;
    while let Some(slices) = unwritten(parts, &mut first) {
        let n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        first = advance(parts, first, n);
    }
    parts.clear();
    w.flush().await
}

/// Writes every byte of `parts` in order, as few system calls as the socket allows;
/// `parts` is empty afterwards.
async fn write_all_vectored(w: &OwnedWriteHalf, parts: &mut Vec<Bytes>) -> std::io::Result<()> {
    let mut first = 0;
    while let Some(slices) = unwritten(parts, &mut first) {
        let n = match w.try_write_vectored(&slices) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                w.writable().await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        first = advance(parts, first, n);
    }
    parts.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// A connected loopback pair: the server's stream, and the client's two halves.
    async fn loopback() -> (tokio::net::TcpStream, tokio::net::tcp::OwnedReadHalf, OwnedWriteHalf) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (server, _) = l.accept().await.expect("accept");
        let (read, write) = client.into_split();
        (server, read, write)
    }

    /// Drops the sender, lets the task finish and checks the server got `want`.
    async fn arrive_in_order(
        tx: FrameSender,
        task: actix_rt::task::JoinHandle<()>,
        server: &mut tokio::net::TcpStream,
        want: &[u8],
    ) {
        drop(tx);
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.expect("read");
        task.await.expect("writer");
        assert_eq!(got.len(), want.len());
        assert!(got == want, "every byte, in order");
    }

    #[test]
    fn parts_arrive_in_order_byte_for_byte() {
        actix_rt::System::new().block_on(async {
            let (mut server, _read, write) = loopback().await;
            let (tx, task) = spawn_writer(WriteSide::Plain(write), |e| panic!("{e}"));
            // Small and large parts (larger than a socket buffer), some empty, queued
            // faster than they can be written.
            let mut want = Vec::new();
            for i in 0..200u32 {
                let len = match i % 4 {
                    0 => 0,
                    1 => 3,
                    2 => 5_000,
                    _ => 300_000,
                };
                let part: Vec<u8> = (0..len).map(|j| (i as usize * 7 + j) as u8).collect();
                want.extend_from_slice(&part);
                tx.send(Bytes::from(part)).expect("queued");
            }
            arrive_in_order(tx, task, &mut server, &want).await;
        });
    }

    #[test]
    fn a_small_frame_with_nothing_queued_leaves_before_the_writer_task_runs() {
        actix_rt::System::new().block_on(async {
            let (server, _read, write) = loopback().await;
            let (tx, _task) = spawn_writer(WriteSide::Plain(write), |e| panic!("{e}"));
            // The server reads with a blocking socket and a deadline, without letting
            // this thread's tasks run: only bytes the sender wrote itself can arrive.
            let mut server = server.into_std().expect("std");
            server.set_nonblocking(false).expect("blocking");
            server
                .set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .expect("deadline");
            tx.send(Bytes::from_static(b"continue")).expect("sent");
            let mut got = [0u8; 8];
            std::io::Read::read_exact(&mut server, &mut got).expect("arrived without the task");
            assert_eq!(&got, b"continue");
            // A large part goes to the task; a small one after it waits its turn.
            let big: Vec<u8> = (0..DIRECT_MAX * 64).map(|i| i as u8).collect();
            tx.send(Bytes::from(big.clone())).expect("queued");
            tx.send(Bytes::from_static(b"after")).expect("queued");
            // Whatever was written is in the socket by now (this thread wrote it).
            server.set_nonblocking(true).expect("nonblocking");
            let mut got = vec![0u8; 5];
            let r = std::io::Read::read(&mut server, &mut got);
            assert!(
                matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
                "nothing left before the task ran: {r:?}"
            );
            server.set_nonblocking(false).expect("blocking");
            // The task writes both, in order, once this thread lets it run.
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let mut all = vec![0u8; big.len() + 5];
                let r = std::io::Read::read_exact(&mut server, &mut all);
                let _ = done_tx.send(r.map(|_| all[..big.len()] == big[..] && &all[big.len()..] == b"after"));
            });
            let in_order = tokio::time::timeout(std::time::Duration::from_secs(10), done_rx)
                .await
                .expect("written within 10 s")
                .expect("the reader answered")
                .expect("read");
            assert!(in_order, "the large part, then the small one");
        });
    }

    #[test]
    fn small_parts_written_directly_until_the_socket_is_full_then_queued_keep_their_order() {
        actix_rt::System::new().block_on(async {
            let (mut server, _read, write) = loopback().await;
            let (tx, task) = spawn_writer(WriteSide::Plain(write), |e| panic!("{e}"));
            // 16 MB in parts of DIRECT_MAX, sent without yielding: the first go straight
            // to the socket until its buffer is full, one goes in part, the rest queue.
            let mut want = Vec::new();
            for i in 0..4096u32 {
                let part: Vec<u8> = (0..DIRECT_MAX).map(|j| (i as usize * 31 + j * 7) as u8).collect();
                want.extend_from_slice(&part);
                tx.send(Bytes::from(part)).expect("sent");
            }
            assert!(tx.shared.queued.get() > 0, "the socket filled up and parts queued");
            arrive_in_order(tx, task, &mut server, &want).await;
        });
    }

    #[test]
    fn nothing_but_empty_parts_is_written_without_error() {
        actix_rt::System::new().block_on(async {
            let (mut server, _read, write) = loopback().await;
            let mut parts = vec![Bytes::new(), Bytes::new()];
            write_all_vectored(&write, &mut parts)
                .await
                .expect("an empty write is no error");
            assert!(parts.is_empty());
            let mut parts = vec![Bytes::new(), Bytes::from_static(b"abc"), Bytes::new()];
            write_all_vectored(&write, &mut parts).await.expect("written");
            drop(write);
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.expect("read");
            assert_eq!(got, b"abc");
        });
    }
}
