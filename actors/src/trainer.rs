//! The Trainer actor: a thin shell around [`TrainerMachine`].
//!
//! It holds one recipient per node (local or remote, it cannot tell), feeds the
//! machine what arrives and sends what the machine returns. Consumers either
//! pull with [`NextBatch`] (the `DistributedCollector` does) or [`Subscribe`]
//! an actor of their own and receive every batch as a [`TrainerEvent`].

use std::rc::Rc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use rollout::checkpoint::Checkpoint;
use rollout::machine::{Collected, Output, SupervisionStats, TrainerError, TrainerMachine};
use rollout::message::{FromNode, ToNode};
use tokio::sync::oneshot;

use crate::delivery::Delivery;
use crate::error::CollectError;
use crate::messages::{
    CancelNext, Deliver, GetWeights, NextBatch, PushWeights, Recycle, SetSeed, StopNodes, StoreWeights, Subscribe,
    TakeCheckpoint, TrainerEvent,
};
use crate::metrics::observe::TrainerMetrics;
use crate::metrics::FailureReason;
use crate::remote::connection::Connection;
use crate::remote::inbox::{Inbox, InboxItem};

type Reply<T> = oneshot::Sender<Result<T, CollectError>>;

/// Brings failed nodes back for the trainer (one per launcher). It runs on the
/// trainer's arbiter and answers with [`NodeRestarted`] or [`NodeRestartFailed`].
pub trait Restarter {
    /// Starts restart number `restart` of node `node` after `cause`; must not block.
    fn restart(&mut self, node: usize, restart: u32, cause: &str, trainer: Addr<Trainer>);
}

/// In-process node `node` is back: its new recipients replace the old ones (a
/// remote node's comes back through the trainer's `Inbox`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct NodeRestarted {
    /// Node index.
    pub node: usize,
    /// Where its messages go now.
    pub recipient: Recipient<Deliver<ToNode>>,
    /// Where its spent batches go.
    pub recycler: Option<Recipient<Recycle>>,
}

/// How the trainer reaches one node.
pub(crate) enum NodeLink {
    /// An in-process node: its actor, and where its spent batches go.
    Local {
        /// Where its messages go.
        node: Recipient<Deliver<ToNode>>,
        /// Where its spent batches go, if anywhere.
        recycler: Option<Recipient<Recycle>>,
    },
    /// A remote node: its connection, used directly on the trainer's thread (its
    /// frames come in through the trainer's [`Inbox`]).
    Remote(Rc<Connection>),
}

impl NodeLink {
    fn send(&self, msg: ToNode) {
        match self {
            NodeLink::Local { node, .. } => node.do_send(Deliver(msg)),
            NodeLink::Remote(c) => c.send(&msg),
        }
    }

    fn recycle(&self, node: usize, data: rollout::TensorDict) {
        match self {
            NodeLink::Local { recycler: Some(r), .. } => r.do_send(Recycle { node: Some(node), data }),
            NodeLink::Local { recycler: None, .. } => {}
            NodeLink::Remote(c) => c.recycle(data),
        }
    }

    /// Bytes a remote node's connection moved since the last call, `(in, out)`.
    fn take_traffic(&self) -> (u64, u64) {
        match self {
            NodeLink::Remote(c) => c.take_traffic(),
            NodeLink::Local { .. } => (0, 0),
        }
    }

    /// Cuts a remote node's connection for `reason` (an in-process node has none).
    fn close(&self, reason: String) {
        if let NodeLink::Remote(c) = self {
            c.close(reason);
        }
    }
}

/// Whether the machine's error `e` about a node's message only dropped it (the node
/// is kept, nothing is closed, the run goes on): what [`Trainer::on_result`] logs and
/// does nothing more for.
fn is_only_dropped(e: &TrainerError) -> bool {
    !matches!(
        e,
        TrainerError::NodeFailed { .. }
            | TrainerError::NoNodes(_)
            | TrainerError::Policy(_)
            | TrainerError::JoinRefused { .. }
            | TrainerError::NodeLost { .. }
            | TrainerError::UnexpectedBatch { .. }
            | TrainerError::BadBatch { .. }
            | TrainerError::BadLayout { .. }
    )
}

/// Node `node` could not be brought back.
#[derive(Message)]
#[rtype(result = "()")]
pub struct NodeRestartFailed {
    /// Node index.
    pub node: usize,
    /// Why.
    pub reason: String,
}

/// Asks the trainer for its supervision counters.
#[derive(Message)]
#[rtype(result = "SupervisionStats")]
pub struct GetStats;

/// The trainer: asks nodes for frames and hands batches to its consumer.
pub struct Trainer {
    machine: TrainerMachine,
    /// Each slot's node (`None`: a free slot of an elastic run).
    nodes: Vec<Option<NodeLink>>,
    /// What remote nodes send, until the actor starts and polls it.
    inbox: Option<Inbox>,
    out: Vec<Output>,
    next: Option<Reply<Option<Collected>>>,
    seed: Option<Reply<u64>>,
    checkpoint: Option<Reply<Box<Checkpoint>>>,
    stop: Option<Reply<()>>,
    sink: Option<Recipient<TrainerEvent>>,
    failure: Option<CollectError>,
    initial_seed: Option<u64>,
    restarter: Option<Box<dyn Restarter>>,
    me: Option<Addr<Trainer>>,
    start: Instant,
    /// What each yielded batch goes through before its consumer sees it.
    delivery: Delivery,
    /// Counts the consumer's waits (a pull, or a push-mode request): a deadline armed
    /// for one wait is stale once a later one began or the wait was answered.
    wait: u64,
    /// Where what passes through is counted, when metrics are on.
    metrics: Option<TrainerMetrics>,
}

/// The consumer's wait number `0` passed its `batch_timeout`.
#[derive(Message)]
#[rtype(result = "()")]
struct Overdue(u64);

impl Trainer {
    /// The error of the consumer's wait for `what` that ran out after `seconds`: when a
    /// node cut off from the run has not come back, that is why, and the error is its
    /// failure, naming the node, the cause of the cut and how long it was waited for;
    /// else the timeout itself.
    fn late(&self, what: &'static str, seconds: f64) -> CollectError {
        match self.machine.cut_off().into_iter().next() {
            Some(cut) => {
                let waited = self.start.elapsed().saturating_sub(cut.at);
                CollectError::NodeFailed {
                    node: cut.node,
                    reason: format!("{}, when {what} ran out of time ({seconds:.1} s)", cut.not_back(waited)),
                }
            }
            None => CollectError::Timeout { what, seconds },
        }
    }

    /// A trainer over a machine and in-process nodes' recipients (index = node index).
    pub fn new(machine: TrainerMachine, nodes: Vec<Recipient<Deliver<ToNode>>>) -> Trainer {
        let nodes = nodes
            .into_iter()
            .map(|node| Some(NodeLink::Local { node, recycler: None }))
            .collect();
        Trainer::over(machine, nodes)
    }

    /// A trainer over remote nodes' connections (index = node index), whose frames,
    /// failures and restarts come through `inbox`.
    pub(crate) fn remote(machine: TrainerMachine, nodes: Vec<Rc<Connection>>, inbox: Inbox) -> Trainer {
        let mut t = Trainer::over(machine, nodes.into_iter().map(|c| Some(NodeLink::Remote(c))).collect());
        t.inbox = Some(inbox);
        t
    }

    fn over(machine: TrainerMachine, nodes: Vec<Option<NodeLink>>) -> Trainer {
        Trainer {
            machine,
            nodes,
            inbox: None,
            out: Vec::new(),
            next: None,
            seed: None,
            checkpoint: None,
            stop: None,
            sink: None,
            failure: None,
            initial_seed: None,
            restarter: None,
            me: None,
            start: Instant::now(),
            delivery: Delivery::default(),
            wait: 0,
            metrics: None,
        }
    }

    /// Elastic runs: `slots` slots in all, those past the nodes given at construction
    /// free until a node joins them ([`InboxItem::Joined`]).
    pub(crate) fn with_slots(mut self, slots: usize) -> Trainer {
        let n = slots.max(self.nodes.len());
        self.nodes.resize_with(n, || None);
        self
    }

    /// Elastic runs: slot `node` is held from the start by the node of `conn`.
    pub(crate) fn with_member(mut self, node: usize, conn: Rc<Connection>) -> Trainer {
        let n = self.nodes.len().max(node + 1);
        self = self.with_slots(n);
        self.nodes[node] = Some(NodeLink::Remote(conn));
        self
    }

    /// Every yielded batch goes through `delivery` (split, postproc, replay buffer) and
    /// each wait of the consumer for one is bounded by its `batch_timeout`.
    pub(crate) fn with_delivery(mut self, mut delivery: Delivery) -> Trainer {
        let total = self.machine.config().total_frames().map_or(-1, |t| t as i64);
        let nodes = self.nodes.len();
        self.metrics = delivery.metrics.take().map(|m| TrainerMetrics::new(m, total, nodes));
        self.delivery = delivery;
        self
    }

    /// Begins a wait of the consumer for a batch: past the delivery's `batch_timeout`
    /// it is told so ([`Overdue`]), unless a batch, the end or an error came first.
    fn begin_wait(&mut self) {
        self.wait += 1;
        let (Some(limit), Some(me)) = (self.delivery.batch_timeout, self.me.clone()) else {
            return;
        };
        let wait = self.wait;
        actix_rt::spawn(async move {
            tokio::time::sleep(limit).await;
            me.do_send(Overdue(wait));
        });
    }

    /// Lets the trainer restart failed nodes through `r` (with supervision on in the machine).
    pub fn with_restarter(mut self, r: Box<dyn Restarter>) -> Trainer {
        self.restarter = Some(r);
        self
    }

    fn restart_node(&mut self, node: usize, restart: u32, cause: String) {
        match (self.restarter.is_some(), self.me.clone()) {
            (true, Some(me)) => {
                tracing::warn!(node, restart, %cause, "restarting node");
                if let Some(m) = &mut self.metrics {
                    m.restarting(node);
                }
                // The failed incarnation's connection, if any, is cut (a stopped process
                // would keep it open); its late reports are ignored while it restarts.
                self.close_node(node, format!("replaced by restart {restart}: {cause}"));
                if let Some(r) = self.restarter.as_mut() {
                    r.restart(node, restart, &cause, me);
                }
            }
            _ => {
                let r =
                    self.machine
                        .node_restart_failed(node, "this launcher cannot restart nodes".into(), &mut self.out);
                self.on_result(r);
            }
        }
    }

    /// Counts a failure of `node` for `reason`, when metrics are on.
    fn count_failure(&mut self, node: usize, reason: FailureReason) {
        if let Some(m) = &mut self.metrics {
            m.failed(node, reason);
        }
    }

    /// Counts a join the machine refused (elastic: a held slot), when metrics are on.
    fn count_refusal(&self) {
        if let Some(m) = &self.metrics {
            m.refused();
        }
    }

    /// Acts on what the machine said about a node message, tick or restart.
    fn on_result(&mut self, r: Result<(), TrainerError>) {
        match &r {
            Err(TrainerError::NodeLost { node, .. }) => self.count_failure(*node, FailureReason::Lost),
            Err(
                TrainerError::UnexpectedBatch { node, .. }
                | TrainerError::BadBatch { node, .. }
                | TrainerError::BadLayout { node, .. },
            ) => self.count_failure(*node, FailureReason::Protocol),
            Err(TrainerError::JoinRefused { .. }) => self.count_refusal(),
            _ => {}
        }
        match r {
            Ok(()) => {}
            Err(TrainerError::NodeFailed { node, reason }) => {
                self.dispatch();
                self.fail(CollectError::NodeFailed { node, reason });
            }
            Err(e @ (TrainerError::NoNodes(_) | TrainerError::Policy(_))) => {
                self.dispatch();
                self.fail(e.into());
            }
            Err(e @ TrainerError::JoinRefused { node, .. }) => {
                tracing::warn!(error = %e, "node refused");
                self.close_node(node, e.to_string());
            }
            Err(TrainerError::NodeLost { node, reason }) => {
                if self.machine.membership().is_some() {
                    // Elastic: nodes come and go; a loss is expected, not an error.
                    tracing::warn!(node, %reason, "node lost; the others go on");
                } else {
                    tracing::error!(node, %reason, "node lost; the others go on");
                }
                // Dropped for good: a remote node's connection is closed with the reason.
                self.close_node(node, format!("dropped: {reason}"));
            }
            Err(
                e @ (TrainerError::UnexpectedBatch { node, .. }
                | TrainerError::BadBatch { node, .. }
                | TrainerError::BadLayout { node, .. }),
            ) => {
                // A protocol violation: a remote node's connection is closed for it.
                tracing::warn!(error = %e, "trainer dropped a node message");
                self.close_node(node, e.to_string());
            }
            Err(e) => tracing::warn!(error = %e, "trainer dropped a node message"),
        }
    }

    /// Moves the machine's clock to now, so that what is sent next is timed from
    /// now, and acts on the deadlines that passed (see [`TrainerMachine::tick`]).
    fn tick(&mut self) {
        let r = self.machine.tick(self.start.elapsed(), &mut self.out);
        self.on_result(r);
        for (node, reason) in self.machine.take_abandoned() {
            tracing::warn!(node, %reason, "node closed at shutdown: past its deadline, it counts as down");
            self.close_node(node, reason);
        }
    }

    /// How often the deadlines are checked: a quarter of the shortest, within 5..=100 ms.
    fn tick_every(&self) -> Duration {
        let d = self.machine.deadlines();
        let sup = self.machine.supervision().and_then(|s| s.continue_timeout);
        [d.seed, d.update_weights, d.checkpoint, d.batch, d.shutdown, sup]
            .into_iter()
            .flatten()
            .min()
            .map_or(Duration::from_millis(100), |t| {
                (t / 4).clamp(Duration::from_millis(5), Duration::from_millis(100))
            })
    }

    /// Seeds every node (the torchrl-style chain) as soon as the trainer starts,
    /// before any frame is collected.
    pub fn with_initial_seed(mut self, seed: u64) -> Trainer {
        self.initial_seed = Some(seed);
        self
    }

    /// Lets spent batches of in-process node `i` go back to it for reuse.
    pub fn with_recyclers(mut self, recyclers: Vec<Option<Recipient<Recycle>>>) -> Trainer {
        for (link, r) in self.nodes.iter_mut().zip(recyclers) {
            if let Some(NodeLink::Local { recycler, .. }) = link {
                *recycler = r;
            }
        }
        self
    }

    /// Cuts node `node`'s connection, if it is remote, for `reason`.
    fn close_node(&self, node: usize, reason: String) {
        if let Some(Some(link)) = self.nodes.get(node) {
            link.close(reason);
        }
    }

    fn recycle(&mut self, node: Option<usize>, data: rollout::TensorDict) {
        match node {
            // A node's own batch goes back to it; a stacked sync round stays here.
            Some(n) => {
                if let Some(Some(link)) = self.nodes.get(n) {
                    link.recycle(n, data);
                }
            }
            None => self.machine.recycle_round(data),
        }
    }

    fn dispatch(&mut self) {
        // Delivering a batch to a subscriber asks the machine for the next one, which
        // appends more output: loop until nothing is left, or it would wait for the
        // next message to the trainer (forever, in sync push mode).
        while !self.out.is_empty() {
            self.dispatch_once();
        }
    }

    fn dispatch_once(&mut self) {
        let outs: Vec<Output> = self.out.drain(..).collect();
        for o in outs {
            match o {
                Output::Send { node, msg } => match self.nodes.get(node) {
                    Some(Some(link)) => {
                        if let Some(m) = &mut self.metrics {
                            m.on_send(node, &msg);
                        }
                        link.send(msg)
                    }
                    _ => tracing::error!(node, "no recipient for node"),
                },
                Output::Yield(c) => {
                    if let Some(m) = &mut self.metrics {
                        m.on_yield(&c, self.machine.frames_yielded());
                    }
                    self.deliver(Ok(Some(c)))
                }
                Output::Finished => self.deliver(Ok(None)),
                Output::Seeded { next_seed } => {
                    if let Some(tx) = self.seed.take() {
                        let _ = tx.send(Ok(next_seed));
                    }
                }
                Output::Recycle { node, data } => self.recycle(Some(node), data),
                Output::RestartNode { node, restart, cause } => self.restart_node(node, restart, cause),
                Output::Checkpoint(c) => {
                    if let Some(tx) = self.checkpoint.take() {
                        let _ = tx.send(Ok(c));
                    }
                }
                Output::CheckpointFailed(reason) => {
                    if let Some(tx) = self.checkpoint.take() {
                        let _ = tx.send(Err(CollectError::Checkpoint(reason)));
                    }
                }
                Output::AllDown => {
                    if let Some(tx) = self.stop.take() {
                        let _ = tx.send(Ok(()));
                    }
                }
            }
        }
    }

    fn deliver(&mut self, r: Result<Option<Collected>, CollectError>) {
        // Answered: the deadline armed for this wait is stale.
        self.wait += 1;
        let r = match r {
            Ok(Some(c)) => self.delivery.apply(c).map(Some),
            other => other,
        };
        if let Some(sink) = &self.sink {
            let ev = match r {
                Ok(Some(c)) => TrainerEvent::Batch(c),
                Ok(None) => TrainerEvent::Finished,
                Err(e) => TrainerEvent::Failed(e),
            };
            let more = matches!(ev, TrainerEvent::Batch(_));
            sink.do_send(ev);
            if more {
                // Push mode: the consumer is always ready for the next batch.
                self.begin_wait();
                if let Err(e) = self.machine.request(&mut self.out) {
                    self.fail(e.into());
                }
            }
            return;
        }
        if let Some(tx) = self.next.take() {
            let _ = tx.send(r);
        } else if let Err(e) = r {
            self.failure = Some(e);
        }
    }

    fn fail(&mut self, e: CollectError) {
        tracing::error!(error = %e, "collection failed");
        self.failure = Some(e.clone());
        self.deliver(Err(e.clone()));
        if let Some(tx) = self.seed.take() {
            let _ = tx.send(Err(e.clone()));
        }
        if let Some(tx) = self.checkpoint.take() {
            let _ = tx.send(Err(e));
        }
    }
}

impl Actor for Trainer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.me = Some(ctx.address());
        if let Some(inbox) = self.inbox.take() {
            ctx.add_stream(inbox.stream());
        }
        // The clock from now: what is sent below is timed from the start, not from `new`.
        self.tick();
        // Every request has a deadline (and shutdown too), supervised or not.
        ctx.run_interval(self.tick_every(), |act, _ctx| {
            act.tick();
            act.dispatch();
            act.count_periodic();
        });
        // A resumed run restores every node's state (seeds and generators included)
        // instead of seeding; requests that arrive meanwhile wait for it.
        match self.machine.start_resume(&mut self.out) {
            Ok(true) => self.initial_seed = None,
            Ok(false) => {}
            Err(e) => self.fail(e.into()),
        }
        self.dispatch();
        if let Some(seed) = self.initial_seed.take() {
            // Requests that arrive meanwhile wait for the chain: see TrainerMachine::request.
            self.machine.set_seed(seed, &mut self.out);
            self.dispatch();
        }
    }
}

impl Trainer {
    /// Metrics read by looking rather than on events: nodes up, bytes moved.
    fn count_periodic(&mut self) {
        let Some(m) = &self.metrics else {
            return;
        };
        let (mut bytes_in, mut bytes_out) = (0, 0);
        for link in self.nodes.iter().flatten() {
            let (i, o) = link.take_traffic();
            bytes_in += i;
            bytes_out += o;
        }
        m.on_tick(self.machine.nodes_up().len(), bytes_in, bytes_out);
    }

    /// A node's message, from its actor or its connection.
    fn on_node(&mut self, msg: FromNode) {
        if let Some(m) = &mut self.metrics {
            m.on_node(&msg);
        }
        // The machine's clock follows the actor's, so failures are recorded when they happen.
        self.tick();
        let node = msg.node();
        let r = match self.machine.on_node(msg, &mut self.out) {
            // Refused and dropped, the node kept: a line a remote node can repeat at
            // will, so it is logged within its connection's budget.
            Err(e) if is_only_dropped(&e) => {
                self.log_dropped(node, &e);
                Ok(())
            }
            r => r,
        };
        self.on_result(r);
        self.dispatch();
    }

    /// Logs that node `node`'s message was dropped for `e`; for a remote node, within
    /// its connection's log budget (past it, the lines are counted, told at the close).
    fn log_dropped(&self, node: usize, e: &TrainerError) {
        let error = e.to_string();
        match self.nodes.get(node) {
            Some(Some(NodeLink::Remote(c))) => {
                if c.may_log(error.len()) {
                    tracing::warn!(node, name = %c.name(), %error, "trainer dropped a node message");
                }
            }
            _ => tracing::warn!(node, %error, "trainer dropped a node message"),
        }
    }

    /// Node `node` is back, reached through `link` now.
    fn node_restarted(&mut self, node: usize, link: NodeLink) {
        if node >= self.nodes.len() {
            tracing::error!(node, "restarted an unknown node");
            return link.close(format!("node {node} does not exist"));
        }
        // The bytes of the incarnation replaced are counted before it goes.
        self.count_periodic();
        self.nodes[node] = Some(link);
        // The re-sent Continue's deadline counts from now, not from the last tick.
        self.tick();
        let r = self.machine.node_restarted(node, &mut self.out);
        self.on_result(r);
        self.dispatch();
    }

    /// Elastic runs: a node joined free slot `node` mid-run.
    fn node_joined(&mut self, node: usize, link: NodeLink) {
        if node >= self.nodes.len() {
            tracing::error!(node, "a node joined an unknown slot");
            return link.close(format!("slot {node} does not exist"));
        }
        // The slot's previous node, if any, is gone: the machine refuses a held slot.
        self.tick();
        let mut out = Vec::new();
        if let Err(e) = self.machine.node_joined(node, &mut out) {
            tracing::warn!(error = %e, "node refused");
            self.count_refusal();
            return link.close(e.to_string());
        }
        if let Some(m) = &self.metrics {
            m.joined();
        }
        self.count_periodic();
        self.nodes[node] = Some(link);
        self.out.extend(out);
        self.dispatch();
    }
}

impl Handler<Deliver<FromNode>> for Trainer {
    type Result = ();

    /// An in-process node's message.
    fn handle(&mut self, msg: Deliver<FromNode>, _ctx: &mut Self::Context) {
        self.on_node(msg.0);
    }
}

impl StreamHandler<InboxItem> for Trainer {
    /// What remote nodes send, read by this actor from their connections.
    fn handle(&mut self, item: InboxItem, _ctx: &mut Self::Context) {
        match item {
            InboxItem::Message(msg) => self.on_node(msg),
            InboxItem::Arriving(node) => {
                let r = self.machine.batch_arriving(node, &mut self.out);
                self.on_result(r);
                self.dispatch();
            }
            InboxItem::Joined(node, conn) => self.node_joined(node, NodeLink::Remote(conn)),
            InboxItem::Restarted(node, conn) => self.node_restarted(node, NodeLink::Remote(conn)),
        }
    }

    /// The inbox never ends; should it, the trainer goes on with its other nodes.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

impl Handler<NodeRestarted> for Trainer {
    type Result = ();

    fn handle(&mut self, msg: NodeRestarted, _ctx: &mut Self::Context) {
        let link = NodeLink::Local {
            node: msg.recipient,
            recycler: msg.recycler,
        };
        self.node_restarted(msg.node, link);
    }
}

impl Handler<NodeRestartFailed> for Trainer {
    type Result = ();

    fn handle(&mut self, msg: NodeRestartFailed, _ctx: &mut Self::Context) {
        // The failure says how long the node was waited for: the clock moves to now.
        self.tick();
        self.count_failure(msg.node, FailureReason::RestartFailed);
        let r = self.machine.node_restart_failed(msg.node, msg.reason, &mut self.out);
        self.on_result(r);
        self.dispatch();
    }
}

impl Handler<GetStats> for Trainer {
    type Result = MessageResult<GetStats>;

    fn handle(&mut self, _msg: GetStats, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.machine.stats())
    }
}

impl Handler<NextBatch> for Trainer {
    type Result = ResponseFuture<Result<Option<Collected>, CollectError>>;

    fn handle(&mut self, _msg: NextBatch, _ctx: &mut Self::Context) -> Self::Result {
        if let Some(e) = self.failure.clone() {
            return Box::pin(async move { Err(e) });
        }
        let (tx, rx) = oneshot::channel();
        self.next = Some(tx);
        self.begin_wait();
        self.tick();
        if let Err(e) = self.machine.request(&mut self.out) {
            self.fail(e.into());
        }
        self.dispatch();
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(CollectError::Stopped("the trainer dropped the request".into())))
        })
    }
}

impl Handler<StoreWeights> for Trainer {
    type Result = Result<u64, CollectError>;

    fn handle(&mut self, msg: StoreWeights, _ctx: &mut Self::Context) -> Self::Result {
        self.machine.check_weights(&msg.0)?;
        let version = self.machine.set_weights(msg.0);
        if let Some(m) = &self.metrics {
            m.stored(version);
        }
        Ok(version)
    }
}

impl Handler<CancelNext> for Trainer {
    type Result = ();

    fn handle(&mut self, _msg: CancelNext, _ctx: &mut Self::Context) {
        if let Some(tx) = self.next.take() {
            let _ = tx.send(Ok(None));
        }
    }
}

impl Handler<GetWeights> for Trainer {
    type Result = Option<std::sync::Arc<rollout::Weights>>;

    fn handle(&mut self, msg: GetWeights, _ctx: &mut Self::Context) -> Self::Result {
        self.machine.current_weights(msg.0).cloned()
    }
}

impl Handler<PushWeights> for Trainer {
    type Result = Result<(), CollectError>;

    fn handle(&mut self, msg: PushWeights, _ctx: &mut Self::Context) -> Self::Result {
        self.tick();
        let r = self.machine.push_weights(msg.0.as_deref(), &mut self.out);
        self.dispatch();
        Ok(r?)
    }
}

impl Handler<SetSeed> for Trainer {
    type Result = ResponseFuture<Result<u64, CollectError>>;

    fn handle(&mut self, msg: SetSeed, _ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.seed = Some(tx);
        self.tick();
        self.machine.set_seed(msg.0, &mut self.out);
        self.dispatch();
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(CollectError::Stopped("the trainer dropped the request".into())))
        })
    }
}

impl Handler<TakeCheckpoint> for Trainer {
    type Result = ResponseFuture<Result<Box<Checkpoint>, CollectError>>;

    fn handle(&mut self, msg: TakeCheckpoint, ctx: &mut Self::Context) -> Self::Result {
        if let Some(e) = self.failure.clone() {
            return Box::pin(async move { Err(e) });
        }
        let (tx, rx) = oneshot::channel();
        self.tick();
        let id = match self.machine.begin_checkpoint(&mut self.out) {
            Ok(id) => id,
            Err(e) => return Box::pin(async move { Err(e.into()) }),
        };
        self.checkpoint = Some(tx);
        self.dispatch();
        // A node that never answers must not hold collection back: past the deadline
        // the checkpoint is given up and the waiting requests are served.
        let timeout = msg.timeout;
        ctx.run_later(timeout, move |act, _ctx| {
            let reason = format!(
                "not every node reported its state within {:.1} s",
                timeout.as_secs_f64()
            );
            let r = act.machine.cancel_checkpoint(id, reason, &mut act.out);
            act.on_result(r);
            act.dispatch();
        });
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(CollectError::Stopped("the trainer dropped the request".into())))
        })
    }
}

impl Handler<StopNodes> for Trainer {
    type Result = ResponseFuture<Result<(), CollectError>>;

    fn handle(&mut self, _msg: StopNodes, _ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.stop = Some(tx);
        if let Some(tx) = self.next.take() {
            let _ = tx.send(Ok(None));
        }
        self.tick();
        self.machine.shutdown(&mut self.out);
        self.dispatch();
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(CollectError::Stopped("the trainer dropped the request".into())))
        })
    }
}

impl Handler<Subscribe> for Trainer {
    type Result = ();

    fn handle(&mut self, msg: Subscribe, _ctx: &mut Self::Context) {
        self.sink = Some(msg.0);
        self.begin_wait();
        if let Err(e) = self.machine.request(&mut self.out) {
            self.fail(e.into());
        }
        self.dispatch();
    }
}

impl Handler<Recycle> for Trainer {
    type Result = ();

    fn handle(&mut self, msg: Recycle, _ctx: &mut Self::Context) {
        // A split, transformed or emptied batch is no node's storage any more.
        if self.delivery.keeps_storage() {
            self.machine.count_recycled();
            self.recycle(msg.node, msg.data);
        }
    }
}

impl Handler<Overdue> for Trainer {
    type Result = ();

    fn handle(&mut self, msg: Overdue, _ctx: &mut Self::Context) {
        if msg.0 != self.wait {
            return;
        }
        let Some(limit) = self.delivery.batch_timeout else {
            return;
        };
        // The consumer hears of it; collection goes on, and the batch that comes late
        // is yielded to the next wait (push mode) or dropped with its reply (pull).
        self.wait += 1;
        let e = self.late("collecting a batch", limit.as_secs_f64());
        if let Some(sink) = &self.sink {
            sink.do_send(TrainerEvent::Failed(e));
        } else if let Some(tx) = self.next.take() {
            let _ = tx.send(Err(e));
        }
    }
}
