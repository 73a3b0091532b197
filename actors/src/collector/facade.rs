//! [`DistributedCollector`]: the facade most users touch.
//!
//! It runs an actix system on a thread of its own (trainer and nodes on its
//! arbiter, one arbiter thread per env worker) and turns the trainer's messages
//! into plain blocking calls, each with a deadline.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use actix::prelude::*;
use rollout::checkpoint::Checkpoint;
use rollout::machine::{Collected, SupervisionStats};
use rollout::{PolicyConfig, Weights};

use super::plan::Plan;
use crate::error::CollectError;
use crate::launch::slurm::SlurmJob;
use crate::launch::{Launched, NodeHandles};
use crate::messages::{
    GetWeights, NextBatch, PushWeights, Recycle, ResetEnvs, SetSeed, StopNodes, StoreWeights, TakeCheckpoint,
};
use crate::metrics::MetricsServer;
use crate::trainer::{GetStats, Trainer};

impl DistributedCollector {
    /// Starts the nodes (on this thread: binding, spawning, `sbatch`), then the actix
    /// system on a thread of its own, and waits (bounded) until the trainer runs.
    pub(super) fn launch(plan: Plan) -> Result<DistributedCollector, CollectError> {
        let Plan {
            nodes: node_plan,
            launch,
            batch_timeout,
            shutdown_timeout,
            node_count,
            ..
        } = plan;
        let (frames_per_batch, total_frames) = {
            let cfg = node_plan.machine.config();
            (cfg.frames_per_batch(), cfg.total_frames())
        };
        let Launched { trainer: start, nodes } = launch.start(node_plan)?;
        let ready_wait = start.ready_wait();
        let (watch, respawn) = (nodes.watch(), nodes.respawn());
        let (ready_tx, ready_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("rollout-system".into())
            .spawn(move || {
                let sys = System::new();
                let started = sys.block_on(start.run(watch, respawn));
                let arbiters = match started {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok((s.trainer, System::current())));
                        s.arbiters
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                if let Err(e) = sys.run() {
                    tracing::error!(error = %e, "actix system ended with an error");
                }
                for a in &arbiters {
                    a.stop();
                }
                for a in arbiters {
                    let _ = a.join();
                }
                let _ = done_tx.send(());
            })
            .map_err(|e| CollectError::Stopped(format!("cannot spawn the system thread: {e}")))?;
        let (trainer, system) = match ready_rx.recv_timeout(ready_wait) {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                return Err(CollectError::Timeout {
                    what: "starting the nodes",
                    seconds: ready_wait.as_secs_f64(),
                })
            }
        };
        Ok(DistributedCollector {
            trainer,
            system,
            thread: Some(thread),
            done: done_rx,
            batch_timeout,
            shutdown_timeout,
            down: false,
            nodes: node_count,
            frames_per_batch,
            total_frames,
            last_stats: None,
            launched: nodes,
            metrics: None,
        })
    }
}

/// A running collection: nodes stepping envs, batches on demand.
///
/// Every call is blocking and bounded (`batch_timeout`, `shutdown_timeout`); dropping
/// the collector shuts it down too, but [`Self::shutdown`] reports what went wrong.
///
/// # Examples
///
/// Two local nodes collecting asynchronously (a batch comes from whichever node is
/// ready first) until 400 frames are yielded, with a weight update in between:
///
/// ```
/// use rollout::{EnvSpec, PolicySpec, Registry};
/// use rollout_actors::DistributedCollector;
///
/// // Weights of the collector's policy (its default, linear): a learner's would go here.
/// let env = Registry::with_builtins().make(&EnvSpec::from("CartPole-v1"))?;
/// let policy = PolicySpec::default().build(env.observation_spec(), env.action_spec(), 0)?;
/// let weights = policy.weights().clone();
///
/// let mut collector = DistributedCollector::builder()
///     .env("CartPole-v1")
///     .nodes(2)
///     .frames_per_batch(100)
///     .total_frames(400)
///     .seed(1)
///     .build()?;
/// let mut frames = 0;
/// while let Some(batch) = collector.next_batch()? {
///     assert!(batch.node.is_some_and(|n| n < 2), "an async batch names its node");
///     frames += batch.data.numel();
///     if batch.index == 0 {
///         let version = collector.update_policy_weights(weights.clone(), None)?;
///         assert!(version > batch.weights_version, "stored as the next version");
///     }
///     collector.recycle(batch);
/// }
/// assert_eq!(frames, 400);
/// collector.shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DistributedCollector {
    trainer: Addr<Trainer>,
    system: System,
    thread: Option<JoinHandle<()>>,
    done: mpsc::Receiver<()>,
    batch_timeout: Duration,
    shutdown_timeout: Duration,
    down: bool,
    nodes: usize,
    /// Frames of each batch the run yields (the last one of `total_frames` may be shorter).
    frames_per_batch: usize,
    /// Frames the run yields in all; `None`: endless.
    total_frames: Option<u64>,
    /// The stats read as the run shut down, for [`Self::stats`] after it.
    last_stats: Option<SupervisionStats>,
    /// The listening address, node processes and SLURM job the launcher started.
    launched: NodeHandles,
    /// The metrics endpoint and how long shutdown waits for its final scrape.
    metrics: Option<(MetricsServer, Duration)>,
}

impl std::fmt::Debug for DistributedCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedCollector")
            .field("nodes", &self.nodes)
            .field("down", &self.down)
            .finish()
    }
}

impl DistributedCollector {
    /// The default policy config, for convenience (`linear`).
    pub fn default_policy() -> PolicyConfig {
        PolicyConfig::Linear
    }

    fn ask<M>(&self, msg: M, what: &'static str, timeout: Duration) -> Result<M::Result, CollectError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        Trainer: Handler<M>,
    {
        if self.down {
            return Err(CollectError::Stopped("the collector was shut down".into()));
        }
        super::handle::ask_trainer(&self.trainer, msg, what, timeout)
    }

    /// The next batch, or `None` once `total_frames` have been yielded. With a
    /// [`CollectorBuilder::replay_buffer`](crate::CollectorBuilder::replay_buffer) the frames go into the buffer and the batch
    /// returned carries no entry (its `data` keeps the batch shape).
    pub fn next_batch(&mut self) -> Result<Option<Collected>, CollectError> {
        if self.down {
            return Ok(None);
        }
        // The trainer bounds the wait by `batch_timeout` and applies the delivery
        // settings (split, postproc, replay buffer); the ask's deadline is a backstop.
        let backstop = self.batch_timeout + Duration::from_secs(1);
        self.ask(NextBatch, "collecting a batch", backstop)?
    }

    /// Stores `weights` as the next version and pushes them to `nodes` (all when `None`).
    /// Returns the new version. Weights whose names, dtypes or shapes do not fit the
    /// policy are a [`CollectError::Config`] (field `weights`, naming the tensor) and
    /// the run goes on untouched, as do weights for an env only the nodes know before
    /// its first node reported its specs (take a batch first); see
    /// [`rollout::machine::TrainerMachine::check_weights`].
    pub fn update_policy_weights(&mut self, weights: Weights, nodes: Option<&[usize]>) -> Result<u64, CollectError> {
        let v = self.set_policy_weights(weights)?;
        self.push_policy_weights(nodes)?;
        Ok(v)
    }

    /// Stores `weights` as the next version without sending them; the update
    /// options (`update_interval`, ...) or [`Self::push_policy_weights`] deliver them.
    /// Checked first, as [`Self::update_policy_weights`] says.
    pub fn set_policy_weights(&mut self, weights: Weights) -> Result<u64, CollectError> {
        self.ask(StoreWeights(weights), "storing weights", self.batch_timeout)?
    }

    /// The weights node `node` acts with now: the last stored ones, or before any the
    /// trainer's version 0 for it (built from the policy spec and handed to every
    /// node). `None` for a node that does not exist.
    pub fn policy_weights(&self, node: usize) -> Result<Option<Arc<Weights>>, CollectError> {
        self.ask(GetWeights(node), "reading weights", self.batch_timeout)
    }

    /// Pushes the stored weights to `nodes` (all when `None`).
    pub fn push_policy_weights(&mut self, nodes: Option<&[usize]>) -> Result<(), CollectError> {
        self.ask(
            PushWeights(nodes.map(<[usize]>::to_vec)),
            "pushing weights",
            self.batch_timeout,
        )?
    }

    /// Takes a checkpoint of the whole run: the trainer's state and every node's
    /// (each env's state and generator, episodes in progress, weights). Call it
    /// between batches; it waits until no node has work in flight (async: batches
    /// in flight are received and kept in the checkpoint, to be yielded after a
    /// resume as they would have been). Save it with [`crate::checkpoint_file::save`]
    /// and go on from it with [`CollectorBuilder::resume`](crate::CollectorBuilder::resume). Fails (and collection
    /// goes on) when a node is down or restarting, or an env or policy cannot be
    /// checkpointed.
    pub fn checkpoint(&mut self) -> Result<Checkpoint, CollectError> {
        let timeout = self.batch_timeout;
        // The reply comes by the machine's own deadline; the ask's is a backstop.
        self.ask(TakeCheckpoint { timeout }, "taking a checkpoint", timeout + timeout)?
            .map(|c| *c)
    }

    /// Reseeds every node (node k gets the seed node k-1 did not use) and returns the next seed.
    pub fn set_seed(&mut self, seed: u64) -> Result<u64, CollectError> {
        self.ask(SetSeed(seed), "seeding the nodes", self.batch_timeout)?
    }

    /// torchrl's `reset()`: every env of every node starts a new episode, the ones in
    /// progress cut without `done`, reseeded from the run's next unused seeds (so the
    /// run stays reproducible from its seed); returns the next unused seed after them.
    /// A sync run's next batch starts every episode anew; in an async run each node
    /// first finishes the batch it is collecting (nodes collect ahead of the consumer),
    /// and starts anew in the one after. See
    /// [`rollout::machine::TrainerMachine::reset_envs`].
    pub fn reset_envs(&mut self) -> Result<u64, CollectError> {
        self.ask(ResetEnvs, "resetting the envs", self.batch_timeout)?
    }

    /// Hands a batch back once you are done with it, so its storage is reused instead
    /// of fresh memory: an in-process node with one env worker collects into it again,
    /// a remote node's connection decodes that node's next batch into it; a sync
    /// round (a stacked copy; the trainer recycles the nodes' shares itself) is where
    /// the next round is stacked. Optional: dropping a batch is fine.
    pub fn recycle(&mut self, batch: Collected) {
        // The trainer drops a batch that is no node's storage (split, transformed, emptied).
        if !self.down {
            self.trainer.do_send(Recycle {
                node: batch.node,
                data: batch.data,
            });
        }
    }

    /// Number of nodes (an elastic run: its slots, `max_nodes`; `stats()` counts joins and leaves).
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Frames of each batch the run yields (the last one of
    /// [`Self::total_frames`] may be shorter).
    pub fn frames_per_batch(&self) -> usize {
        self.frames_per_batch
    }

    /// Frames the run yields in all; `None` for an endless run.
    pub fn total_frames(&self) -> Option<u64> {
        self.total_frames
    }

    /// A handle for the calls other threads make while one waits in
    /// [`Self::next_batch`]: weights, stats, and cancelling that wait.
    pub fn handle(&self) -> super::handle::CollectorHandle {
        super::handle::CollectorHandle::new(self.trainer.clone(), self.batch_timeout)
    }

    /// Node restarts, late batches dropped, frames collected and (elastic runs) nodes
    /// joined and left so far. After [`Self::shutdown`], the last ones: read once every
    /// node was down (an error only when the trainer could not be asked then).
    pub fn stats(&self) -> Result<SupervisionStats, CollectError> {
        if self.down {
            return self.last_stats.clone().ok_or_else(|| {
                CollectError::Stopped("the collector was shut down before its stats could be read".into())
            });
        }
        self.ask(GetStats, "reading the stats", self.batch_timeout)
    }

    /// The address remote nodes join, when they do.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.launched.listen_addr
    }

    /// Process ids of the node processes this collector started (`Process` launcher).
    pub fn node_pids(&self) -> Vec<u32> {
        self.launched.pids()
    }

    /// The id of the SLURM job array running the nodes (`Slurm` launcher); node `i` is
    /// array task `i` (`ID_i`).
    pub fn slurm_job_id(&self) -> Option<&str> {
        self.launched.slurm_job.as_ref().map(SlurmJob::id)
    }

    /// Every SLURM job of the run: the job array, then each single task resubmitted to
    /// restart a node (supervised runs). Empty for other launchers.
    pub fn slurm_job_ids(&self) -> Vec<String> {
        self.launched
            .slurm_job
            .as_ref()
            .map(SlurmJob::job_ids)
            .unwrap_or_default()
    }

    /// Where the run's metrics are served, when [`CollectorBuilder::metrics`](crate::CollectorBuilder::metrics) asked.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(s, _)| s.local_addr())
    }

    /// Keeps `served` running until the collector is dropped; `linger`: see
    /// [`CollectorBuilder::metrics_linger`](crate::CollectorBuilder::metrics_linger).
    pub(super) fn serve_metrics(&mut self, served: Option<MetricsServer>, linger: Duration) {
        self.metrics = served.map(|s| (s, linger));
    }

    /// Stops every node, waits for them (bounded), joins every thread started, and
    /// ends the SLURM job (checking that no task is left). Idempotent.
    pub fn shutdown(&mut self) -> Result<(), CollectError> {
        if self.down {
            return Ok(());
        }
        if let Some((server, linger)) = &self.metrics {
            // The last batch is counted: one more scrape records the final values.
            if !linger.is_zero() && !server.wait_for_scrape(*linger) {
                tracing::warn!(seconds = linger.as_secs_f64(), "no scrape of the final metrics");
            }
        }
        let r = self.ask(StopNodes, "shutting the nodes down", self.shutdown_timeout);
        if r.is_ok() {
            // The trainer answered: every node is down, nothing changes the stats any more.
            self.last_stats = self.ask(GetStats, "reading the stats", self.shutdown_timeout).ok();
        }
        self.down = true;
        self.system.stop();
        let slurm = self.launched.shutdown(self.shutdown_timeout);
        let joined = self.done.recv_timeout(self.shutdown_timeout).is_ok();
        if let Some(t) = self.thread.take() {
            if joined {
                let _ = t.join();
            }
        }
        r??;
        if let Some(Err(e)) = slurm {
            return Err(CollectError::Launch(e.to_string()));
        }
        if !joined {
            return Err(CollectError::Timeout {
                what: "joining the collector's threads",
                seconds: self.shutdown_timeout.as_secs_f64(),
            });
        }
        Ok(())
    }
}

impl Iterator for DistributedCollector {
    type Item = Result<Collected, CollectError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch().transpose()
    }
}

impl Drop for DistributedCollector {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "shutdown on drop");
        }
    }
}
