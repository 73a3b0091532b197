//! Remote nodes over TCP: the trainer's listener, connections and inbox, the node's join.

pub mod arrival;
pub mod connection;
pub mod frames;
pub mod inbox;
pub mod join;
pub mod link;
pub mod listener;
pub mod lobby;
pub mod parts;
pub mod peer;
pub mod timing;

pub use join::{read_token, run_node, JoinError, LeaveHandle, NodeOptions};
