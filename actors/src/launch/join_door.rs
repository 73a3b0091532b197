//! The door remote nodes join by (`Process`, `External` and `Slurm` launchers): the
//! address to bind, the handshake's settings and how long to wait for every node.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use super::config_error;
use crate::collector::ListeningHook;
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
        let addr = listener
            .local_addr()
            .map_err(|e| config_error("listen", format!("cannot read the bound address: {e}")))?;
        if let Some(f) = &self.on_listening {
            f(addr);
        }
        Ok((listener, addr))
    }
}
