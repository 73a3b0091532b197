//! The Trainer actor: a thin shell around [`TrainerMachine`].
//!
//! It holds one recipient per node (local or remote, it cannot tell), feeds the
//! machine what arrives and sends what the machine returns. Consumers either
//! pull with [`NextBatch`] (the `DistributedCollector` does) or [`Subscribe`]
//! an actor of their own and receive every batch as a [`TrainerEvent`].

use std::rc::Rc;
use std::time::Instant;

use actix::prelude::*;
use rollout::checkpoint::Checkpoint;
use rollout::machine::{Collected, Output, SupervisionStats, TrainerMachine};
use rollout::message::ToNode;
use tokio::sync::oneshot;

use crate::delivery::Delivery;
use crate::error::CollectError;
use crate::messages::{Deliver, Recycle, TrainerEvent};
use crate::metrics::observe::TrainerMetrics;
use crate::remote::connection::Connection;
use crate::remote::inbox::Inbox;
#[cfg(doc)]
use crate::{
    messages::{NextBatch, Subscribe},
    remote::inbox::InboxItem,
};

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

    /// Lets the trainer restart failed nodes through `r` (with supervision on in the machine).
    pub fn with_restarter(mut self, r: Box<dyn Restarter>) -> Trainer {
        self.restarter = Some(r);
        self
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
        ctx.run_interval(self.machine.tick_every(), |act, _ctx| {
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

mod carry_out;
mod consumer;
mod node_link;
mod nodes;

use node_link::NodeLink;
