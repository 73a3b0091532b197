//! rollout: the pure core of a distributed reinforcement-learning collector.
//!
//! Everything here is data and decisions: tensors, environments, policies, the
//! collection loop, post-processing, the message vocabulary and the state
//! machines of the trainer and the node. No threads, no sockets, no actix:
//! the `rollout-actors` crate wraps these in actors.
//!
//! Two cargo features, off by default, add what not every user needs: `onnx`
//! (ONNX policies, run with tract) and `learn` (the PPO learner, the `learn` module).
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod checkpoint;
pub mod config_error;
pub mod connection;
pub mod env;
pub mod frame_decode;
pub mod frame_reader;
#[cfg(feature = "learn")]
pub mod learn;
pub mod machine;
pub mod message;
pub mod node_spec;
pub mod node_state;
pub mod peer_text;
pub mod policy;
pub mod pool;
pub mod postproc;
pub mod replay;
pub mod rng;
pub mod rollout;
pub mod run_plan;
pub mod schema;
pub mod shares;
pub mod space;
pub mod space_json;
pub mod spec;
pub mod strict_json;
pub mod supervisor;
pub mod tensor;
pub mod wire;

pub use env::{Action, Counting, CountingConfig, Env, EnvError, EnvSnapshot, EnvSpec, Registry, Transition};
pub use policy::{ExplorationType, Policy, PolicyConfig, PolicyError, PolicySpec, SamplerState, Weights};
pub use rng::RngState;
pub use spec::{Spec, SpecError};
pub use tensor::{DType, Tensor, TensorDict, TensorError};
