//! The write side of a connection: frames queue in a channel, one task writes them.
//!
//! Writers never block an actor: encoding happens in the actor, the socket write
//! in its own task. Dropping every sender ends the task, which closes the socket.
//! A frame may be queued as several parts (headers, then tensors straight from
//! their memory); the task writes whatever is queued with one vectored write, so
//! parts cost no extra system call each.

use std::io::IoSlice;

use bytes::{Buf, Bytes};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

/// Parts taken from the queue for one vectored write, at most.
const MAX_PARTS: usize = 64;

/// Starts the writer task; the returned sender queues whole frames (prefix included),
/// or a frame's parts one after the other from one sender.
/// `on_error` is called once if a write fails. The task ends, after writing what
/// was queued, when every sender is dropped.
pub fn spawn_writer(
    mut w: OwnedWriteHalf,
    on_error: impl FnOnce(String) + 'static,
) -> (mpsc::UnboundedSender<Bytes>, actix_rt::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
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
            if let Err(e) = write_all_vectored(&mut w, &mut queued).await {
                on_error(format!("write failed: {e}"));
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    (tx, task)
}

/// Writes every byte of `parts` in order, as few system calls as the socket allows;
/// `parts` is empty afterwards.
async fn write_all_vectored(w: &mut OwnedWriteHalf, parts: &mut Vec<Bytes>) -> std::io::Result<()> {
    let mut first = 0;
    loop {
        // Parts empty from the start count as written (and a write of nothing would
        // look like a closed socket).
        while first < parts.len() && parts[first].is_empty() {
            first += 1;
        }
        if first == parts.len() {
            break;
        }
        let slices: Vec<IoSlice<'_>> = parts[first..].iter().map(|p| IoSlice::new(p)).collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        // The socket took `n` bytes: at most what remains, so `first` stays in bounds.
        while n > 0 {
            let p = &mut parts[first];
            let take = n.min(p.len());
            p.advance(take);
            n -= take;
            if p.is_empty() {
                first += 1;
            }
        }
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

    #[test]
    fn parts_arrive_in_order_byte_for_byte() {
        actix_rt::System::new().block_on(async {
            let (mut server, _read, write) = loopback().await;
            let (tx, task) = spawn_writer(write, |e| panic!("{e}"));
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
            drop(tx);
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.expect("read");
            task.await.expect("writer");
            assert_eq!(got.len(), want.len());
            assert!(got == want, "every byte, in order");
        });
    }

    #[test]
    fn nothing_but_empty_parts_is_written_without_error() {
        actix_rt::System::new().block_on(async {
            let (mut server, _read, mut write) = loopback().await;
            let mut parts = vec![Bytes::new(), Bytes::new()];
            write_all_vectored(&mut write, &mut parts)
                .await
                .expect("an empty write is no error");
            assert!(parts.is_empty());
            let mut parts = vec![Bytes::new(), Bytes::from_static(b"abc"), Bytes::new()];
            write_all_vectored(&mut write, &mut parts).await.expect("written");
            drop(write);
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.expect("read");
            assert_eq!(got, b"abc");
        });
    }
}
