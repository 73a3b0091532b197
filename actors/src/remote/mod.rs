//! Remote nodes over TCP: the trainer's listener and peers, the node's join.

pub mod arrival;
pub mod frames;
pub mod join;
pub mod link;
pub mod listener;
pub mod parts;
pub mod peer;

pub use join::{read_token, run_node, JoinError, LeaveHandle, NodeOptions};
