//! One connection between the trainer and a remote node, as state machines with
//! no IO: the handshake, admission to a node slot, the heartbeat deadlines and the
//! rules of what may come when and from whom.
//!
//! The IO shells (the trainer's listener and peers, the node's join in
//! `rollout-actors`) read and write bytes and fire timers; everything they decide
//! about the protocol, they ask of these machines. Input: decoded frames, timer
//! ticks with `now`. Output: frames to send, messages to deliver, or a reason to
//! close. Frames and their encoding are in [`crate::wire`].

pub mod admission;
pub mod liveness;
pub mod log_limit;
pub mod node_side;
pub mod pending;
pub mod trainer_side;

pub use admission::Admission;
pub use liveness::{Liveness, Tick};
pub use log_limit::{LogBudget, LogLimit};
pub use node_side::{NodeHandshake, NodeSession, NodeStep};
pub use pending::PendingLogins;
pub use trainer_side::{Closing, HandshakeStep, TrainerHandshake, TrainerSession};

/// What to do with a frame that arrived after the handshake.
#[derive(Clone, Debug, PartialEq)]
pub enum Inbound<M> {
    /// Hand this message up (to the trainer, or to the node).
    Deliver(M),
    /// Nothing to do (a heartbeat: hearing it is all it is for).
    Nothing,
    /// Send a heartbeat now, and count the next one from now: the node answers the
    /// trainer's beat ([`NodeSession::on_frame`]), so the heartbeats of a trainer's
    /// many nodes reach it together, read in a few wakeups instead of one each.
    /// Only the node's side says this.
    Answer,
    /// The peer broke the protocol: close the connection, for this reason.
    Close(String),
}
