//! Connecting and logging in: reach the trainer (retrying while it is not yet
//! listening), run the login handshake to its welcome or refusal.

use std::io;
use std::time::Duration;

use rollout::connection::{NodeHandshake, NodeStep};
use rollout::wire::{self, NodeFrame, TrainerFrame, Welcome, DEFAULT_MAX_FRAME};
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, TlsStream};

use super::{JoinError, NodeOptions};
use crate::remote::stream::{tls_socket, PeerStream};
use crate::remote::timing::read_frame;

/// How a node's connection is secured: its TLS connector and the name the trainer's
/// certificate must hold, or nothing (plain TCP).
pub(super) type Secure = Option<(TlsConnector, ServerName<'static>)>;

/// Connects to the trainer at `addr` (retrying with backoff while it refuses), runs
/// the TLS handshake when `secure`, and logs in with `token`: the stream and the
/// trainer's welcome, or why not.
pub(super) async fn handshake(
    addr: &str,
    token: &[u8],
    opts: &NodeOptions,
    secure: &Secure,
) -> Result<(PeerStream, Welcome), JoinError> {
    let connect = |reason: String| JoinError::Connect {
        addr: addr.to_string(),
        reason,
    };
    // The trainer may not be listening yet (nodes are often started first, by a
    // scheduler): retry with backoff; the caller's deadline bounds the whole wait.
    let mut backoff = Duration::from_millis(20);
    let tcp = loop {
        match TcpStream::connect(addr).await {
            Ok(s) => break s,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::debug!(%addr, "trainer not listening yet, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(connect(e.to_string())),
        }
    };
    let _ = tcp.set_nodelay(true);
    let mut s = match secure {
        None => PeerStream::Plain(tcp),
        Some((connector, name)) => {
            let tls = connector
                .connect(name.clone(), tls_socket(tcp))
                .await
                .map_err(|e| connect(format!("TLS handshake failed: {e}")))?;
            PeerStream::Tls(Box::new(TlsStream::Client(tls)))
        }
    };
    let max = DEFAULT_MAX_FRAME;
    let send = |f: NodeFrame| wire::encode(&f, max).map_err(|e| JoinError::Protocol(e.to_string()));
    let mut hs = NodeHandshake::new(token, opts.name.clone(), opts.index);
    write_frame(&mut s, &send(hs.hello())?)
        .await
        .map_err(|e| connect(e.to_string()))?;
    loop {
        match hs.on_frame(read_trainer_frame(&mut s, max).await?) {
            NodeStep::Send(f) => write_frame(&mut s, &send(f)?)
                .await
                .map_err(|e| connect(e.to_string()))?,
            NodeStep::Welcomed(w) => return Ok((s, *w)),
            NodeStep::Rejected(reason) => return Err(JoinError::Rejected(reason)),
            NodeStep::Violation(reason) => return Err(JoinError::Protocol(reason)),
        }
    }
}

/// Writes one encoded frame and flushes it (under TLS, out of the session).
async fn write_frame(s: &mut PeerStream, bytes: &[u8]) -> io::Result<()> {
    s.write_all(bytes).await?;
    s.flush().await
}

/// One frame of the trainer's, read whole and decoded.
async fn read_trainer_frame(s: &mut PeerStream, max: usize) -> Result<TrainerFrame, JoinError> {
    let body = read_frame(s, max).await.map_err(JoinError::Lost)?;
    wire::decode(&body).map_err(|e| JoinError::Protocol(e.to_string()))
}
