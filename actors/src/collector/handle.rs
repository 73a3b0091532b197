//! [`CollectorHandle`]: the calls on a running collector that need no `&mut`, from any
//! thread, while another thread waits in
//! [`DistributedCollector::next_batch`](crate::DistributedCollector::next_batch).
//!
//! A learner's logging thread reads the stats and its optimiser thread pushes weights
//! while the main thread waits for a batch: the trainer actor answers them at once
//! (a pending batch request does not block it), so none of them waits for the batch.

use std::time::Duration;

use actix::prelude::*;
use rollout::machine::{Collected, SupervisionStats};
use rollout::Weights;

use crate::block::block_on_timeout;
use crate::error::CollectError;
use crate::messages::{CancelNext, PushWeights, Recycle, StoreWeights};
use crate::trainer::{GetStats, Trainer};

/// A cloneable handle on a running collector (see
/// [`DistributedCollector::handle`](crate::DistributedCollector::handle)).
/// Once the collector is shut down its calls fail with [`CollectError::Stopped`].
#[derive(Clone, Debug)]
pub struct CollectorHandle {
    trainer: Addr<Trainer>,
    timeout: Duration,
}

/// Sends `msg` to the trainer and waits (bounded) for its answer.
pub(super) fn ask_trainer<M>(
    trainer: &Addr<Trainer>,
    msg: M,
    what: &'static str,
    timeout: Duration,
) -> Result<M::Result, CollectError>
where
    M: Message + Send + 'static,
    M::Result: Send,
    Trainer: Handler<M>,
{
    match block_on_timeout(trainer.send(msg), timeout) {
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => Err(CollectError::Stopped(e.to_string())),
        None => Err(CollectError::Timeout {
            what,
            seconds: timeout.as_secs_f64(),
        }),
    }
}

impl CollectorHandle {
    pub(super) fn new(trainer: Addr<Trainer>, timeout: Duration) -> CollectorHandle {
        CollectorHandle { trainer, timeout }
    }

    /// [`DistributedCollector::update_policy_weights`](crate::DistributedCollector::update_policy_weights), from any thread.
    pub fn update_policy_weights(&self, weights: Weights, nodes: Option<&[usize]>) -> Result<u64, CollectError> {
        let v = self.set_policy_weights(weights)?;
        self.push_policy_weights(nodes)?;
        Ok(v)
    }

    /// [`DistributedCollector::set_policy_weights`](crate::DistributedCollector::set_policy_weights), from any thread.
    pub fn set_policy_weights(&self, weights: Weights) -> Result<u64, CollectError> {
        ask_trainer(&self.trainer, StoreWeights(weights), "storing weights", self.timeout)?
    }

    /// [`DistributedCollector::push_policy_weights`](crate::DistributedCollector::push_policy_weights), from any thread.
    pub fn push_policy_weights(&self, nodes: Option<&[usize]>) -> Result<(), CollectError> {
        ask_trainer(
            &self.trainer,
            PushWeights(nodes.map(<[usize]>::to_vec)),
            "pushing weights",
            self.timeout,
        )?
    }

    /// [`DistributedCollector::stats`](crate::DistributedCollector::stats), from any thread.
    pub fn stats(&self) -> Result<SupervisionStats, CollectError> {
        ask_trainer(&self.trainer, GetStats, "reading the stats", self.timeout)
    }

    /// Makes a [`DistributedCollector::next_batch`](crate::DistributedCollector::next_batch) waiting on another thread return
    /// `Ok(None)` now (before shutting the run down from this thread, say); the batch
    /// it waited for is not yielded. Collection is not affected. Nothing happens when
    /// no call waits.
    pub fn cancel_next_batch(&self) -> Result<(), CollectError> {
        ask_trainer(&self.trainer, CancelNext, "cancelling a batch request", self.timeout)
    }

    /// [`DistributedCollector::recycle`](crate::DistributedCollector::recycle), from any
    /// thread: hands a batch's storage back without waiting (a language binding whose
    /// batches are freed by its garbage collector, on whatever thread that runs). After
    /// shutdown it is dropped.
    pub fn recycle(&self, batch: Collected) {
        self.trainer.do_send(Recycle {
            node: batch.node,
            data: batch.data,
        });
    }
}
