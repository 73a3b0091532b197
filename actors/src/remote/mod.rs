//! Remote nodes over TCP (plain or TLS): the trainer's listener, connections and inbox,
//! the node's runtime.
//! Users reach only what a node program needs (re-exported below); the rest is the
//! crate's own.

pub(crate) mod arrival;
pub(crate) mod connection;
pub(crate) mod frames;
pub(crate) mod inbox;
pub(crate) mod link;
pub(crate) mod listener;
pub(crate) mod lobby;
pub(crate) mod node_runtime;
pub(crate) mod parts;
pub(crate) mod peer;
pub(crate) mod stream;
pub(crate) mod timing;
pub mod tls;

pub use node_runtime::{read_token, run_node, JoinError, LeaveHandle, NodeOptions};
pub use tls::{NodeTls, TlsError, TrainerTls};
