//! Sans-IO state machines: the trainer's and the node's decisions.
//!
//! A message (or a request) goes in, messages to send come out. Actors own a
//! machine and do the IO; tests drive machines directly, with no thread.

pub mod node;
pub mod trainer;

pub use node::{NodeError, NodeMachine, NodeOutput, WorkerCmd};
pub use trainer::{
    Collected, ConfigError, NodeSupervision, Output, RequestDeadlines, SupervisionStats, TrainerConfig, TrainerError,
    TrainerMachine, Verdict,
};
