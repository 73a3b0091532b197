//! The door remote nodes join by (`Process`, `External` and `Slurm` launchers): the
//! address to bind, the handshake's settings and how long to wait for every node.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use super::{config_error, ListeningHook};
use crate::error::CollectError;
use crate::remote::listener::DoorConfig;

/// How remote nodes come in.
#[derive(Clone)]
pub(crate) struct JoinDoor {
    /// The address to bind (`HOST:PORT`; port 0 picks a free one).
    pub(crate) listen: String,
    /// Told the bound address at once (the CLI's "listening on" line).
    pub(crate) on_listening: Option<ListeningHook>,
    /// Token, heartbeat and handshake deadline.
    pub(crate) door: DoorConfig,
    /// Longest wait for every node to join.
    pub(crate) join_timeout: Duration,
}

impl JoinDoor {
    /// Binds the listening socket here, so its address is known before any node is started.
    pub(crate) fn bind(&self) -> Result<(TcpListener, SocketAddr), CollectError> {
        let listener = TcpListener::bind(&self.listen)
            .map_err(|e| config_error("listen", format!("cannot bind {}: {e}", self.listen)))?;
        widen_backlog(&listener);
        let addr = listener
            .local_addr()
            .map_err(|e| config_error("listen", format!("cannot read the bound address: {e}")))?;
        if self.door.tls.is_none() && !addr.ip().is_loopback() {
            tracing::warn!(
                %addr,
                "listening without TLS on an address other hosts reach: batches, weights and the model cross \
                 the network in the clear (set tls_cert and tls_key, `--tls-cert`/`--tls-key`)"
            );
        }
        if let Some(f) = &self.on_listening {
            f(addr);
        }
        Ok((listener, addr))
    }
}

/// Connections the kernel queues before the door accepts them. The standard library
/// listens with a backlog of 128: a thousand nodes connecting at once overflow it, and
/// each SYN dropped costs its node a second (the first retransmission). The kernel caps
/// it at `net.core.somaxconn`.
pub(crate) const LISTEN_BACKLOG: i32 = 4096;

/// Listens again with [`LISTEN_BACKLOG`] (Linux takes a second `listen` as a new
/// backlog); a failure leaves the old backlog, which only makes big joins slower.
fn widen_backlog(listener: &TcpListener) {
    if let Err(error) = socket2::SockRef::from(listener).listen(LISTEN_BACKLOG) {
        tracing::debug!(%error, "cannot widen the listen backlog");
    }
}
