//! actix envelopes for the core vocabulary (`rollout::message`) and the
//! trainer's own requests. The core types stay free of actix; these wrappers
//! give them a `Message` impl without copying anything.

use actix::prelude::*;
use rollout::machine::Collected;
use rollout::rollout::Rollout;
use rollout::{TensorDict, Weights};

use crate::error::CollectError;

/// A core message delivered to an actor: `Deliver<ToNode>` (trainer → node),
/// `Deliver<FromNode>` (node → trainer), `Deliver<WorkerCmd>` (node → env worker),
/// `Deliver<WorkerEvent>` (env worker → node).
///
/// The core stays free of actix, and a message keeps the one name it has in the
/// core and on the wire: this wrapper only gives it actix's `Message` impl, moving
/// it, never copying or encoding it.
#[derive(Debug)]
pub struct Deliver<M>(pub M);

impl<M: 'static> Message for Deliver<M> {
    type Result = ();
}

/// Node → env worker: the worker's rollout failed; go on with this one, rebuilt from
/// the node's spec. Sent in order with the worker's `Deliver<WorkerCmd>`, so later commands use it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Replace(pub Rollout);

impl std::fmt::Debug for Replace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replace")
            .field("envs", &self.0.num_envs())
            .field("frames", &self.0.frames())
            .finish()
    }
}

/// Ask the trainer for the next batch; `Ok(None)` once `total_frames` were yielded.
#[derive(Message, Debug)]
#[rtype(result = "Result<Option<Collected>, CollectError>")]
pub struct NextBatch;

/// Store new weights (the next version) without sending them; returns the version,
/// or refuses weights that do not fit the policy (nothing stored).
#[derive(Message, Debug)]
#[rtype(result = "Result<u64, CollectError>")]
pub struct StoreWeights(pub Weights);

/// Answer a pending [`NextBatch`] with `Ok(None)` now (its caller is being shut down
/// from another thread); collection goes on.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct CancelNext;

/// The weights node `.0` acts with now (the stored ones, or its version 0); `None`
/// for an unknown node.
#[derive(Message, Debug)]
#[rtype(result = "Option<std::sync::Arc<Weights>>")]
pub struct GetWeights(pub usize);

/// Send the stored weights to these nodes (all when `None`).
#[derive(Message, Debug)]
#[rtype(result = "Result<(), CollectError>")]
pub struct PushWeights(pub Option<Vec<usize>>);

/// Reseed every node (torchrl-style chain); answers the next unused seed.
#[derive(Message, Debug)]
#[rtype(result = "Result<u64, CollectError>")]
pub struct SetSeed(pub u64);

/// torchrl's `reset()`: every env of every node starts a new episode, reseeded from the
/// run's next unused seeds (`TrainerMachine::reset_envs`); answers the next unused seed
/// once the chain is done.
#[derive(Message, Debug)]
#[rtype(result = "Result<u64, CollectError>")]
pub struct ResetEnvs;

/// Take a checkpoint of the whole run (between batches); answers once every node
/// reported its state, or fails once the deadline passed without (collection goes on
/// either way). Collection waits meanwhile.
#[derive(Message, Debug)]
#[rtype(result = "Result<Box<rollout::checkpoint::Checkpoint>, CollectError>")]
pub struct TakeCheckpoint {
    /// Longest wait for every node's state (batches in flight are received first).
    pub timeout: std::time::Duration,
}

/// Stop every node; answers once all are down.
#[derive(Message, Debug)]
#[rtype(result = "Result<(), CollectError>")]
pub struct StopNodes;

/// What a subscribed actor receives from the trainer (push mode).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub enum TrainerEvent {
    /// A batch, in order.
    Batch(Collected),
    /// `total_frames` reached; nothing more comes.
    Finished,
    /// Collection failed.
    Failed(CollectError),
}

/// Subscribe an actor: the trainer then collects on its own and pushes every
/// batch to it as a [`TrainerEvent`] (the embedded use).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Subscribe(pub Recipient<TrainerEvent>);

/// Storage of a yielded batch handed back for reuse: an in-process node collects
/// into it again, a remote node's connection decodes its next batch into it. Ignored
/// when the run splits, post-processes or stores its batches (no node's storage then).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Recycle {
    /// The node that produced it (`None` for a sync batch, which is then dropped).
    pub node: Option<usize>,
    /// The batch.
    pub data: TensorDict,
}
