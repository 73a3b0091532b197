//! The write side of a connection: frames queue in a channel, one task writes them.
//!
//! Writers never block an actor: encoding happens in the actor, the socket write
//! in its own task. Dropping every sender ends the task, which closes the socket.

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

/// Starts the writer task; the returned sender queues whole frames (prefix included).
/// `on_error` is called once if a write fails. The task ends, after writing what
/// was queued, when every sender is dropped.
pub fn spawn_writer(
    mut w: OwnedWriteHalf,
    on_error: impl FnOnce(String) + 'static,
) -> (mpsc::UnboundedSender<Bytes>, actix_rt::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    let task = actix_rt::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if let Err(e) = w.write_all(&frame).await {
                on_error(format!("write failed: {e}"));
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    (tx, task)
}
