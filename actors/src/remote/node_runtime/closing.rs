//! Ending the connection: a clean close after the node's last frame, and telling the
//! trainer why a node could not start.

use std::time::Duration;

use rollout::message::FromNode;
use rollout::wire::{self, NodeFrame};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::remote::stream::PeerStream;

/// How long a node that said its last frame waits for the trainer to close.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// A second handle on `stream`'s socket (a duplicate of its descriptor), so that the
/// socket outlives the halves the link reads and writes through. `None` if the
/// descriptor cannot be duplicated. (Under TLS the writer closed the session, its
/// `close_notify` sent, before this handle shuts the socket; what it reads after is
/// dropped unread, records or not.)
pub(super) fn second_handle(stream: &PeerStream) -> Option<TcpStream> {
    let std: std::net::TcpStream = socket2::SockRef::from(stream.tcp()).try_clone().ok()?.into();
    std.set_nonblocking(true).ok()?;
    TcpStream::from_std(std).ok()
}

/// Closes the connection after the node's last frame (`down`, `leave`) so that the
/// frame arrives: the write side is shut (the trainer reads the frame, then the end,
/// and closes its side), and what the trainer sent meanwhile (a heartbeat) is read
/// and dropped until it closes, at most [`CLOSE_WAIT`]. A socket closed with unread
/// bytes in it is reset instead, and a reset throws away what was still queued to
/// send: the last frame itself, on a slow link.
pub(super) async fn close_cleanly(mut s: TcpStream) {
    use tokio::io::AsyncReadExt;
    let _ = s.shutdown().await;
    let drain = async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, drain).await;
}

/// Sends `failed` with `reason` and closes the connection, bounded: a node that cannot
/// start says why before it goes, so the trainer handles it as any failed node.
pub(super) async fn tell_failure(stream: &mut PeerStream, node: usize, reason: String, max: usize) {
    tracing::error!(node, %reason, "cannot start");
    let frame = NodeFrame::Message(FromNode::Failed { node, reason });
    let Ok(bytes) = wire::encode(&frame, max) else {
        return;
    };
    let send = async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), send).await;
}
