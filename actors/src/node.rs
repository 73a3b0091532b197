//! The Node actor: a thin shell around [`NodeMachine`]. It holds the machine, the
//! addresses of its env workers and their arbiters; its handlers hand every
//! trainer message and worker event to the machine and carry out the outputs:
//! commands to workers, messages to the trainer, and on [`NodeOutput::Replace`] a
//! rebuilt rollout installed in its worker (or in a new worker actor on the same
//! arbiter if the actor itself died). Every decision is the machine's.
//!
//! It also holds its workers' stop flag: a worker collects a batch inside one
//! handler, so the `Stop` the machine sends queues behind it. The flag is set as
//! the node begins to stop (`Shutdown`), is halted, or goes away, and each worker's
//! collection loop ends between steps when it sees it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use rollout::machine::node::WorkerEvent;
use rollout::machine::{NodeMachine, NodeOutput, WorkerCmd};
use rollout::message::{FromNode, ToNode};
use rollout::node_spec::NodeSpec;
use rollout::rollout::Rollout;
use rollout::Registry;

use crate::env_worker::{EnvWorker, Returned};
use crate::messages::{Deliver, Recycle, Replace};

/// One node: receives the trainer's messages, drives and supervises its env workers.
pub struct Node {
    machine: NodeMachine,
    workers: Vec<Addr<EnvWorker>>,
    /// The arbiter of each worker, to start a new worker actor on if the old one died.
    arbiters: Vec<ArbiterHandle>,
    trainer: Recipient<Deliver<FromNode>>,
    out: Vec<NodeOutput>,
    /// Workers whose actor was found dead and reported, until replaced.
    dead: Vec<bool>,
    /// Origin of the times given to the machine.
    start: Instant,
    /// Shared with every worker: set once the node stops (see the module's doc).
    stop: WorkersStop,
    /// Each worker's slot for its batches' storage ([`Returned`]); empty: storage
    /// goes back through the mailbox.
    returned: Vec<Returned>,
}

/// The workers' stop flag, set when the node lets go of it: however the node ends
/// (down, halted, its system stopped), its workers stop between steps, so whoever
/// joins their threads next does not wait for a batch.
struct WorkersStop(Arc<AtomicBool>);

impl WorkersStop {
    fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Drop for WorkersStop {
    fn drop(&mut self) {
        self.set();
    }
}

impl Node {
    /// A node over already started workers, reporting to `trainer`. Without
    /// [`Self::with_rebuild`] (or a machine built with
    /// [`NodeMachine::with_rebuild`]) a failed worker cannot be rebuilt: each
    /// attempt counts as one more failure, so the node fails once the restart
    /// intensity is spent.
    pub fn new(machine: NodeMachine, workers: Vec<Addr<EnvWorker>>, trainer: Recipient<Deliver<FromNode>>) -> Node {
        let dead = vec![false; workers.len()];
        Node {
            machine,
            workers,
            arbiters: Vec::new(),
            trainer,
            out: Vec::new(),
            dead,
            start: Instant::now(),
            stop: WorkersStop(Arc::new(AtomicBool::new(false))),
            returned: Vec::new(),
        }
    }

    /// The slots its workers were given ([`EnvWorker::with_returned`]), one per
    /// worker in order: a batch's storage goes back there, not behind a `Collect`
    /// already queued. A worker started later (a dead actor replaced) gets its slot too.
    pub fn with_returned(mut self, returned: Vec<Returned>) -> Node {
        self.returned = returned;
        self
    }

    /// The flag its workers were given ([`EnvWorker::with_stop_flag`]): the node sets
    /// it when it stops, so that a batch in flight ends between steps instead of
    /// holding the shutdown back. A worker started later (a dead actor replaced) gets it too.
    pub fn with_stop_flag(mut self, stop: Arc<AtomicBool>) -> Node {
        // The flag replaced is nobody's: dropping (so setting) it stops no worker.
        self.stop = WorkersStop(stop);
        self
    }

    /// Tells the workers to end the batch in flight between steps.
    fn stop_workers(&self) {
        self.stop.set();
    }

    /// Lets the node rebuild a failed worker `w` from `spec` and `registry`
    /// (`spec.rebuild_worker(registry, w, ..)`, decided by the machine);
    /// `arbiters[w]` is the arbiter worker `w` runs on, where a new worker actor is
    /// started if the old one died.
    pub fn with_rebuild(mut self, spec: NodeSpec, registry: Registry, arbiters: Vec<ArbiterHandle>) -> Node {
        self.machine = self.machine.with_rebuild(spec, registry);
        self.arbiters = arbiters;
        self
    }

    /// Hands a worker's event to the machine.
    fn on_worker(&mut self, event: WorkerEvent) {
        let now = self.start.elapsed();
        if let Err(e) = self.machine.on_worker(event, now, &mut self.out) {
            tracing::warn!(node = self.machine.index(), error = %e, "node dropped a worker answer");
        }
    }

    /// Carries out the machine's outputs.
    fn dispatch(&mut self, ctx: &mut Context<Self>) {
        // Carrying out can produce more outputs (a dead worker is reported back to
        // the machine): loop until none.
        while !self.out.is_empty() {
            let outs = std::mem::take(&mut self.out);
            for o in outs {
                match o {
                    NodeOutput::Worker { worker, cmd } => self.send_worker(worker, cmd),
                    NodeOutput::Trainer(m) => self.trainer.do_send(Deliver(m)),
                    NodeOutput::Replace {
                        worker,
                        restart,
                        rollout,
                    } => self.replace(worker, restart.number, *rollout, ctx),
                }
            }
        }
        if self.machine.is_down() {
            ctx.stop();
        }
    }

    fn send_worker(&mut self, worker: usize, cmd: WorkerCmd) {
        let Some(w) = self.workers.get(worker) else {
            tracing::error!(node = self.machine.index(), worker, "no such worker");
            return;
        };
        if w.connected() {
            match (cmd, self.returned.get(worker)) {
                (WorkerCmd::Recycle(data), Some(slot)) => slot.put(data),
                (cmd, _) => w.do_send(Deliver(cmd)),
            }
            return;
        }
        // The actor is gone (a panic outside the env boundary): a death, reported once.
        match cmd {
            WorkerCmd::Stop => self.on_worker(WorkerEvent::Stopped { worker }),
            // Its storage goes with it; its commands are asked again after the restart.
            _ if self.dead[worker] => {}
            WorkerCmd::Recycle(_) => {}
            _ => {
                self.dead[worker] = true;
                self.on_worker(WorkerEvent::Failed {
                    worker,
                    reason: "the env worker actor died (mailbox closed)".into(),
                });
            }
        }
    }

    /// Installs worker `worker`'s rebuilt rollout: in its actor, or in a new actor
    /// on its arbiter if the actor died.
    fn replace(&mut self, worker: usize, restart: u32, rollout: Rollout, ctx: &mut Context<Self>) {
        let node = self.machine.index();
        let Some(addr) = self.workers.get(worker) else {
            tracing::error!(node, worker, "no such worker");
            return;
        };
        if addr.connected() {
            addr.do_send(Replace(rollout));
            tracing::info!(node, worker, restart, "env worker restarted");
            return;
        }
        let Some(arbiter) = self.arbiters.get(worker) else {
            self.on_worker(WorkerEvent::Failed {
                worker,
                reason: "the env worker actor died and has no arbiter".into(),
            });
            return;
        };
        let to_node = ctx.address().recipient();
        let stop = Arc::clone(&self.stop.0);
        let returned = self.returned.get(worker).cloned().unwrap_or_default();
        self.workers[worker] = EnvWorker::start_in_arbiter(arbiter, move |_| {
            EnvWorker::new(worker, rollout, to_node, true)
                .with_stop_flag(stop)
                .with_returned(returned)
        });
        self.dead[worker] = false;
        tracing::warn!(
            node,
            worker,
            restart,
            "env worker actor was dead: started a new one on its arbiter"
        );
    }
}

impl Actor for Node {
    type Context = Context<Self>;
}

impl Handler<Deliver<ToNode>> for Node {
    type Result = ();

    fn handle(&mut self, msg: Deliver<ToNode>, ctx: &mut Self::Context) {
        if let Err(e) = self.machine.handle(msg.0, &mut self.out) {
            tracing::warn!(node = self.machine.index(), error = %e, "node refused a message");
        }
        if self.machine.is_stopping() {
            // Before the `Stop`s go out: they wait behind any batch in flight.
            self.stop_workers();
        }
        self.dispatch(ctx);
    }
}

impl Handler<Deliver<WorkerEvent>> for Node {
    type Result = ();

    fn handle(&mut self, msg: Deliver<WorkerEvent>, ctx: &mut Self::Context) {
        self.on_worker(msg.0);
        self.dispatch(ctx);
    }
}

impl Handler<Recycle> for Node {
    type Result = ();

    fn handle(&mut self, msg: Recycle, ctx: &mut Self::Context) {
        self.machine.recycle(msg.data, &mut self.out);
        self.dispatch(ctx);
    }
}

/// Stops a node actor at once, sending nothing (its replacement takes over).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Halt;

impl Handler<Halt> for Node {
    type Result = ();

    fn handle(&mut self, _msg: Halt, ctx: &mut Self::Context) {
        self.stop_workers();
        ctx.stop();
    }
}
