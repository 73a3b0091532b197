//! rollout-actors: the rollout collector as an actix actor system.
//!
//! A [`Trainer`](trainer::Trainer) actor asks [`Node`](node::Node) actors for
//! frames; each node drives its [`EnvWorker`](env_worker::EnvWorker)s, one
//! arbiter thread each. Most users touch only [`DistributedCollector`].
//!
//! Two cargo features, off by default and forwarded to the core crate: `learn` (the
//! PPO learner actor, `learner`) and `onnx` (running ONNX policies; without it a
//! policy file, or any `onnx` policy, is refused with an error naming the feature).
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![forbid(unsafe_code)]

mod block;
pub mod bounded_file;
pub mod checkpoint_file;
pub mod collector;
mod delivery;
pub mod env_worker;
pub mod error;
pub mod launch;
#[cfg(feature = "learn")]
pub mod learner;
pub mod messages;
pub mod metrics;
pub mod node;
mod node_start;
pub mod policy_file;
pub mod remote;
pub mod replay;
pub mod testkit;
pub mod trainer;

pub use collector::{
    CollectorArgs, CollectorBuilder, CollectorHandle, DistributedCollector, Embedded, ExplorationName, NodeOverrides,
    Postproc, Secs,
};
pub use error::CollectError;
pub use launch::{Launcher, SlurmOptions};
pub use replay::SharedReplayBuffer;
pub use rollout::checkpoint::Checkpoint;
pub use rollout::machine::Collected;
