//! How a node joins: its name, the slot it asks for, its deadline, its envs and TLS.

use std::time::Duration;

use rollout::Registry;

use super::LeaveHandle;
use crate::remote::tls::NodeTls;

/// How a node joins.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// A name for the trainer's logs.
    pub name: String,
    /// Ask for this node index (`None`: any free slot).
    pub index: Option<usize>,
    /// Give up connecting and handshaking after this long.
    pub connect_timeout: Duration,
    /// Where envs are built from: register your own envs here.
    pub registry: Registry,
    /// Leave the run cleanly on SIGTERM or SIGINT: send `leave`, return `Ok` (what
    /// `rollout node` does; off by default, so a library caller keeps its signals).
    pub leave_on_signals: bool,
    /// Leave the run cleanly when this handle is pulled (see [`LeaveHandle::leave`]).
    pub leave: Option<LeaveHandle>,
    /// TLS to the trainer (its certificate checked against a CA; a certificate of the
    /// node's own for mutual TLS); `None`: plain TCP, for a trainer without TLS.
    pub tls: Option<NodeTls>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            name: default_name(),
            index: None,
            connect_timeout: Duration::from_secs(30),
            registry: Registry::with_builtins(),
            leave_on_signals: false,
            leave: None,
            tls: None,
        }
    }
}

fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}:{}", host.trim(), std::process::id())
}
