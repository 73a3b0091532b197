//! Message-level testing without threads or sleeps.
//!
//! As quinn tests its protocol core with an in-memory pair, these harnesses
//! pump the very state machines the actors run: [`NodeHarness`] drives one node
//! (with real env workers, stepped on the calling thread), [`TrainerHarness`]
//! drives the trainer against nodes the test scripts by hand, and [`Cluster`]
//! wires a trainer to in-memory nodes so a whole run happens in one call stack.

use std::collections::VecDeque;
use std::time::Duration;

use rollout::checkpoint::{Checkpoint, CheckpointError};
use rollout::machine::{Collected, NodeMachine, NodeOutput, Output, TrainerConfig, TrainerError, TrainerMachine};
use rollout::message::{Batch, Continue, FromNode, ToNode};
use rollout::node_spec::NodeSpec;
use rollout::rollout::{keys, Rollout, RolloutError};
use rollout::{Registry, Tensor, TensorDict, Weights};

use crate::env_worker::execute;

/// One node with real env workers, driven by messages in memory.
///
/// Its node machine decides everything, as in the Node actor: a failed worker is
/// rebuilt from the spec (when built with [`Self::new`]) and the harness installs
/// the machine's `Replace`.
/// Time is a manual clock, moved with [`Self::advance`]: restart intensities are
/// tested without waiting.
///
/// # Examples
///
/// A `Continue` for 8 frames over 2 workers comes back as one batch of 2 envs ×
/// 4 steps, collected by real `Counting` envs on the calling thread:
///
/// ```
/// use rollout::message::{Continue, FromNode, ToNode};
/// use rollout::node_spec::NodeSpec;
/// use rollout::rollout::keys;
/// use rollout::{PolicyConfig, Registry};
/// use rollout_actors::testkit::NodeHarness;
///
/// let spec = NodeSpec::new("Counting", PolicyConfig::Constant { value: 1.0 }, 2).with_env_share(4);
/// let mut node = NodeHarness::new(&spec, &Registry::with_builtins())?;
/// let replies = node.send(ToNode::Continue(Continue { seq: 0, frames: 8 }));
/// let [FromNode::Batch(batch)] = &replies[..] else {
///     panic!("one batch, got {replies:?}");
/// };
/// assert_eq!((batch.seq, batch.data.batch_size()), (0, &[2usize, 4][..]));
/// // Each env counts 0, 1, 2, 3 under the constant action 1.0.
/// let obs: Vec<f32> = batch.data.f32(keys::OBSERVATION)?.iter().copied().collect();
/// assert_eq!(obs, [0., 1., 2., 3., 0., 1., 2., 3.]);
/// assert!(node.refusals().is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct NodeHarness {
    machine: NodeMachine,
    workers: Vec<Option<Rollout>>,
    out: Vec<NodeOutput>,
    log: Vec<String>,
    rebuild: Option<(NodeSpec, Registry)>,
    now: Duration,
    restarts: Vec<(usize, u32, u64)>,
}

impl NodeHarness {
    /// Builds the node `spec` describes, envs from `registry`; failed workers are
    /// rebuilt from them.
    pub fn new(spec: &NodeSpec, registry: &Registry) -> Result<NodeHarness, RolloutError> {
        let workers = spec.build_workers(registry)?.into_iter().map(Some).collect();
        let mut h = NodeHarness::from_rollouts(spec.index, workers);
        h.rebuild = Some((spec.clone(), registry.clone()));
        Ok(h.with_machine(NodeMachine::from_spec(spec)))
    }

    /// A node over rollouts built by the test (one per worker). With no spec, a
    /// failed worker cannot be rebuilt: each attempt counts as one more failure.
    pub fn from_rollouts(index: usize, workers: Vec<Option<Rollout>>) -> NodeHarness {
        NodeHarness {
            machine: NodeMachine::new(index, workers.len(), 1),
            workers,
            out: Vec::new(),
            log: Vec::new(),
            rebuild: None,
            now: Duration::ZERO,
            restarts: Vec::new(),
        }
    }

    /// Replaces the node's machine (say, one with another restart intensity). A
    /// harness built with [`Self::new`] gives it the spec to rebuild workers from.
    pub fn with_machine(mut self, machine: NodeMachine) -> NodeHarness {
        self.machine = match &self.rebuild {
            Some((spec, registry)) => machine.with_rebuild(spec.clone(), registry.clone()),
            None => machine,
        };
        self
    }

    /// Moves the harness clock forward by `d` (it starts at zero).
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// The harness clock.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Every restart done so far: (worker, restart number, seed).
    pub fn restarts(&self) -> &[(usize, u32, u64)] {
        &self.restarts
    }

    /// The rollout of worker `worker` (`None` while failed and not rebuilt).
    pub fn worker(&self, worker: usize) -> Option<&Rollout> {
        self.workers.get(worker).and_then(Option::as_ref)
    }

    /// Delivers `msg` and runs the node until it is idle; returns what it sent the trainer.
    pub fn send(&mut self, msg: ToNode) -> Vec<FromNode> {
        if let Err(e) = self.machine.handle(msg, &mut self.out) {
            self.log.push(e.to_string());
        }
        self.pump()
    }

    /// Messages the node refused or worker answers it dropped, as text.
    pub fn refusals(&self) -> &[String] {
        &self.log
    }

    /// The node's machine.
    pub fn machine(&self) -> &NodeMachine {
        &self.machine
    }

    /// Carries out the machine's outputs, running each worker command on the
    /// calling thread and handing the worker's answer back to the machine, until
    /// nothing is left to do.
    fn pump(&mut self) -> Vec<FromNode> {
        let mut to_trainer = Vec::new();
        while !self.out.is_empty() {
            let batch: Vec<NodeOutput> = self.out.drain(..).collect();
            for o in batch {
                match o {
                    NodeOutput::Trainer(m) => to_trainer.push(m),
                    NodeOutput::Replace {
                        worker,
                        restart,
                        rollout,
                    } => match self.workers.get_mut(worker) {
                        Some(slot) => {
                            *slot = Some(*rollout);
                            self.restarts.push((worker, restart.number, restart.seed));
                        }
                        None => self.log.push(format!("no worker {worker}")),
                    },
                    NodeOutput::Worker { worker, cmd } => {
                        let Some(slot) = self.workers.get_mut(worker) else {
                            self.log.push(format!("no worker {worker}"));
                            continue;
                        };
                        let Some(ev) = execute(slot, worker, cmd) else {
                            continue;
                        };
                        if let Err(e) = self.machine.on_worker(ev, self.now, &mut self.out) {
                            self.log.push(e.to_string());
                        }
                    }
                }
            }
        }
        to_trainer
    }
}

/// The trainer's machine against nodes the test plays by hand.
///
/// # Examples
///
/// A sync round of two nodes: the trainer asks each for half the batch and
/// yields once both answered (here with [`scripted_batch`]es).
///
/// ```
/// use rollout::machine::TrainerConfig;
/// use rollout::shares::Shares;
/// use rollout::message::{Continue, FromNode};
/// use rollout_actors::testkit::{scripted_batch, TrainerHarness};
///
/// let mut trainer = TrainerHarness::new(TrainerConfig::new(Shares::new(8, vec![2, 2], 1, true, None)?))?;
/// trainer.request()?;
/// let asked = trainer.take_continues();
/// assert_eq!(
///     asked,
///     [(0, Continue { seq: 0, frames: 4 }), (1, Continue { seq: 1, frames: 4 })]
/// );
/// for (node, c) in asked {
///     trainer.reply(FromNode::Batch(scripted_batch(node, c, 2, 0, 0.0)))?;
/// }
/// let yielded = trainer.take_yielded();
/// assert_eq!(yielded.len(), 1);
/// assert_eq!(yielded[0].data.batch_size(), &[2, 2, 2], "nodes × envs × steps");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TrainerHarness {
    machine: TrainerMachine,
    out: Vec<Output>,
    sent: VecDeque<(usize, ToNode)>,
    yielded: VecDeque<Collected>,
    finished: bool,
    seeded: Option<u64>,
    all_down: bool,
    restarts: VecDeque<(usize, u32, String)>,
    checkpoints: VecDeque<Result<Checkpoint, String>>,
}

impl TrainerHarness {
    /// A trainer for `cfg` that supervises its nodes.
    pub fn supervised(
        cfg: TrainerConfig,
        sup: rollout::machine::NodeSupervision,
    ) -> Result<TrainerHarness, rollout::machine::ConfigError> {
        let mut t = TrainerHarness::new(cfg)?;
        t.machine = t.machine.with_supervision(sup);
        Ok(t)
    }

    /// A trainer for `cfg` with elastic membership (`cfg.nodes` slots at most), the
    /// nodes in `members` holding their slots from the start.
    pub fn elastic(
        cfg: TrainerConfig,
        membership: rollout::machine::trainer::Membership,
        members: &[usize],
    ) -> Result<TrainerHarness, rollout::machine::ConfigError> {
        let mut t = TrainerHarness::new(cfg.clone())?;
        t.machine = TrainerMachine::new(cfg)?.with_elastic(membership)?;
        t.machine.start_with(members);
        Ok(t)
    }

    /// Elastic: a node joined free slot `node` (what an `InboxItem::Joined` does in the actor).
    pub fn node_joined(&mut self, node: usize) -> Result<(), TrainerError> {
        let r = self.machine.node_joined(node, &mut self.out);
        self.sort();
        r
    }

    /// The clock moves to `now` (checks `continue_timeout`).
    pub fn tick(&mut self, now: Duration) -> Result<(), TrainerError> {
        let r = self.machine.tick(now, &mut self.out);
        self.sort();
        r
    }

    /// The launcher brought node `node` back.
    pub fn node_restarted(&mut self, node: usize) -> Result<(), TrainerError> {
        let r = self.machine.node_restarted(node, &mut self.out);
        self.sort();
        r
    }

    /// The launcher could not bring node `node` back.
    pub fn node_restart_failed(&mut self, node: usize, reason: &str) -> Result<(), TrainerError> {
        let r = self
            .machine
            .node_restart_failed(node, reason.to_string(), &mut self.out);
        self.sort();
        r
    }

    /// The `(node, restart, cause)` of every restart asked for since the last call.
    pub fn take_restarts(&mut self) -> Vec<(usize, u32, String)> {
        self.restarts.drain(..).collect()
    }

    /// A trainer for `cfg`.
    pub fn new(cfg: TrainerConfig) -> Result<TrainerHarness, rollout::machine::ConfigError> {
        Ok(TrainerHarness {
            machine: TrainerMachine::new(cfg)?,
            out: Vec::new(),
            sent: VecDeque::new(),
            yielded: VecDeque::new(),
            finished: false,
            seeded: None,
            all_down: false,
            restarts: VecDeque::new(),
            checkpoints: VecDeque::new(),
        })
    }

    fn sort(&mut self) {
        for o in self.out.drain(..) {
            match o {
                Output::Send { node, msg } => self.sent.push_back((node, msg)),
                Output::Yield(c) => self.yielded.push_back(c),
                Output::Finished => self.finished = true,
                Output::Seeded { next_seed } => self.seeded = Some(next_seed),
                Output::AllDown => self.all_down = true,
                // Counted in the machine's `stats()`; its frames are asked again.
                Output::Recycle { .. } | Output::DroppedLagging { .. } => {}
                Output::RestartNode { node, restart, cause } => self.restarts.push_back((node, restart, cause)),
                Output::Checkpoint(c) => self.checkpoints.push_back(Ok(*c)),
                Output::CheckpointFailed(reason) => self.checkpoints.push_back(Err(reason)),
            }
        }
    }

    /// The consumer asks for the next batch.
    pub fn request(&mut self) -> Result<(), TrainerError> {
        let r = self.machine.request(&mut self.out);
        self.sort();
        r
    }

    /// A node's message arrives.
    pub fn reply(&mut self, msg: FromNode) -> Result<(), TrainerError> {
        let r = self.machine.on_node(msg, &mut self.out);
        self.sort();
        r
    }

    /// The first bytes of node `node`'s batch arrived (see
    /// [`TrainerMachine::batch_arriving`]); the batch itself follows with [`Self::reply`].
    pub fn batch_arriving(&mut self, node: usize) -> Result<(), TrainerError> {
        let r = self.machine.batch_arriving(node, &mut self.out);
        self.sort();
        r
    }

    /// Stores weights (next version) and returns the version.
    pub fn set_weights(&mut self, w: Weights) -> u64 {
        self.machine.set_weights(w)
    }

    /// Pushes the stored weights to `nodes` (all when `None`).
    pub fn push_weights(&mut self, nodes: Option<&[usize]>) -> Result<(), TrainerError> {
        let r = self.machine.push_weights(nodes, &mut self.out);
        self.sort();
        r
    }

    /// Starts the seeding chain.
    pub fn set_seed(&mut self, seed: u64) {
        self.machine.set_seed(seed, &mut self.out);
        self.sort();
    }

    /// Starts a checkpoint (see [`TrainerMachine::begin_checkpoint`]); returns its id.
    pub fn begin_checkpoint(&mut self) -> Result<u64, TrainerError> {
        let r = self.machine.begin_checkpoint(&mut self.out);
        self.sort();
        r
    }

    /// Gives up checkpoint `id` (its deadline passed).
    pub fn cancel_checkpoint(&mut self, id: u64, reason: &str) -> Result<(), TrainerError> {
        let r = self.machine.cancel_checkpoint(id, reason.to_string(), &mut self.out);
        self.sort();
        r
    }

    /// Goes on from `checkpoint` (see [`TrainerMachine::restore`]).
    pub fn restore(&mut self, checkpoint: Checkpoint) -> Result<(), CheckpointError> {
        let r = self.machine.restore(checkpoint, &mut self.out);
        self.sort();
        r
    }

    /// Checkpoints taken (or failed, with the reason) since the last call.
    pub fn take_checkpoints(&mut self) -> Vec<Result<Checkpoint, String>> {
        self.checkpoints.drain(..).collect()
    }

    /// Starts the shutdown.
    pub fn shutdown(&mut self) {
        self.machine.shutdown(&mut self.out);
        self.sort();
    }

    /// Everything sent to nodes since the last call, in order.
    pub fn take_sent(&mut self) -> Vec<(usize, ToNode)> {
        self.sent.drain(..).collect()
    }

    /// The `Continue`s sent since the last call (other messages are kept).
    pub fn take_continues(&mut self) -> Vec<(usize, Continue)> {
        let mut cont = Vec::new();
        let mut rest = VecDeque::new();
        for (n, m) in self.sent.drain(..) {
            match m {
                ToNode::Continue(c) => cont.push((n, c)),
                other => rest.push_back((n, other)),
            }
        }
        self.sent = rest;
        cont
    }

    /// Batches yielded since the last call.
    pub fn take_yielded(&mut self) -> Vec<Collected> {
        self.yielded.drain(..).collect()
    }

    /// True once the machine said `Finished`.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The seed the seeding chain ended with.
    pub fn seeded(&self) -> Option<u64> {
        self.seeded
    }

    /// True once every node is down.
    pub fn all_down(&self) -> bool {
        self.all_down
    }

    /// The machine.
    pub fn machine(&self) -> &TrainerMachine {
        &self.machine
    }
}

/// A well-formed batch answering `c` from `node` with `envs` envs: frames counted
/// from `first` in `observation`, everything else zero. For scripted nodes.
///
/// # Examples
///
/// ```
/// use rollout::message::Continue;
/// use rollout::rollout::keys;
/// use rollout_actors::testkit::scripted_batch;
///
/// let b = scripted_batch(1, Continue { seq: 3, frames: 6 }, 2, 7, 10.0);
/// assert_eq!((b.node, b.seq, b.weights_version), (1, 3, 7));
/// assert_eq!(b.data.batch_size(), &[2, 3]);
/// let obs: Vec<f32> = b.data.f32(keys::OBSERVATION)?.iter().copied().collect();
/// assert_eq!(obs, [10., 11., 12., 13., 14., 15.]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn scripted_batch(node: usize, c: Continue, envs: usize, version: u64, first: f32) -> Batch {
    let steps = c.frames / envs.max(1);
    let n = envs * steps;
    let obs: Vec<f32> = (0..n).map(|i| first + i as f32).collect();
    let mk = |shape: &[usize], t: Tensor| (shape.to_vec(), t);
    let entries = [
        (
            keys::OBSERVATION,
            mk(
                &[envs, steps, 1],
                Tensor::F32(ndarray::ArrayD::from_shape_vec(vec![envs, steps, 1], obs).unwrap_or_default()),
            ),
        ),
        (
            keys::NEXT_REWARD,
            mk(&[envs, steps, 1], Tensor::zeros(rollout::DType::F32, &[envs, steps, 1])),
        ),
        (
            keys::TRAJ_IDS,
            mk(&[envs, steps], Tensor::zeros(rollout::DType::I64, &[envs, steps])),
        ),
    ];
    let mut data = TensorDict::new(&[envs, steps]);
    for (k, (_, t)) in entries {
        // Shapes are built from the batch shape above, so `set` cannot fail.
        let _ = data.set(k, t);
    }
    Batch {
        node,
        seq: c.seq,
        weights_version: version,
        data,
    }
}

/// A trainer wired to in-memory nodes: a whole run in one call stack, no threads.
///
/// # Examples
///
/// Two async nodes of `Counting` envs, 16 frames in batches of 8:
///
/// ```
/// use rollout::machine::TrainerConfig;
/// use rollout::shares::Shares;
/// use rollout::node_spec::NodeSpec;
/// use rollout::{PolicyConfig, Registry};
/// use rollout_actors::testkit::Cluster;
///
/// let spec = |index: usize| {
///     NodeSpec::new("Counting", PolicyConfig::Constant { value: 1.0 }, 2)
///         .with_index(index)
///         .with_lanes(2 * index as u64, 4)
///         .with_env_share(8)
/// };
/// let cfg = TrainerConfig::new(Shares::new(8, vec![2, 2], 1, false, Some(16))?);
/// let mut cluster = Cluster::new(cfg, &[spec(0), spec(1)], &Registry::with_builtins())?;
/// let mut frames = 0;
/// while let Some(batch) = cluster.next_batch()? {
///     assert_eq!(batch.data.batch_size(), &[2, 4], "one node's envs × steps");
///     frames += batch.data.numel();
/// }
/// assert_eq!(frames, 16);
/// assert!(cluster.trainer.finished());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Cluster {
    /// The trainer side.
    pub trainer: TrainerHarness,
    /// The nodes, by index.
    pub nodes: Vec<NodeHarness>,
}

impl Cluster {
    /// A cluster of a trainer for `cfg` and nodes built from `specs`.
    pub fn new(cfg: TrainerConfig, specs: &[NodeSpec], registry: &Registry) -> Result<Cluster, String> {
        let trainer = TrainerHarness::new(cfg).map_err(|e| e.to_string())?;
        let nodes = specs
            .iter()
            .map(|s| NodeHarness::new(s, registry))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        Ok(Cluster { trainer, nodes })
    }

    /// Delivers every message in flight, both ways, until nothing moves.
    /// Returns the trainer's refusals of node messages.
    pub fn pump(&mut self) -> Vec<TrainerError> {
        let mut errors = Vec::new();
        loop {
            let sent = self.trainer.take_sent();
            if sent.is_empty() {
                return errors;
            }
            for (node, msg) in sent {
                let replies = match self.nodes.get_mut(node) {
                    Some(n) => n.send(msg),
                    None => continue,
                };
                for r in replies {
                    if let Err(e) = self.trainer.reply(r) {
                        errors.push(e);
                    }
                }
            }
        }
    }

    /// Runs the seeding chain to its end and returns the next seed.
    pub fn set_seed(&mut self, seed: u64) -> Option<u64> {
        self.trainer.set_seed(seed);
        self.pump();
        self.trainer.seeded()
    }

    /// Takes a checkpoint of the whole cluster (between batches).
    pub fn checkpoint(&mut self) -> Result<Checkpoint, String> {
        let _id = self.trainer.begin_checkpoint().map_err(|e| e.to_string())?;
        self.pump();
        match self.trainer.take_checkpoints().pop() {
            Some(r) => r,
            None => Err("the checkpoint did not complete".into()),
        }
    }

    /// Goes on from `checkpoint` (call before the first request).
    pub fn restore(&mut self, checkpoint: Checkpoint) -> Result<(), String> {
        self.trainer.restore(checkpoint).map_err(|e| e.to_string())?;
        let errors = self.pump();
        match errors.into_iter().next() {
            Some(e) => Err(e.to_string()),
            None => Ok(()),
        }
    }

    /// Requests and pumps until a batch is yielded (or the run is finished).
    pub fn next_batch(&mut self) -> Result<Option<Collected>, TrainerError> {
        self.trainer.request()?;
        self.pump();
        Ok(self.trainer.yielded.pop_front())
    }
}
