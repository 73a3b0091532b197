//! The Node actor: a thin shell around [`NodeMachine`] that owns its env workers
//! and supervises them: on [`NodeOutput::RestartWorker`] it rebuilds the worker's
//! rollout from the node's [`NodeSpec`] and hands it to the worker actor (or to a
//! new one on the same arbiter if the actor itself died).

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use rollout::machine::{NodeMachine, NodeOutput, WorkerCmd};
use rollout::node_spec::NodeSpec;
use rollout::{Registry, Weights};

use crate::env_worker::EnvWorker;
use crate::messages::{FromNodeMsg, Recycle, Replace, ToNodeMsg, ToWorker, WorkerEvent};

/// What a node needs to rebuild a failed env worker.
struct Rebuild {
    spec: NodeSpec,
    registry: Registry,
    /// The arbiter of each worker, to start a new worker actor on if the old one died.
    arbiters: Vec<ArbiterHandle>,
}

/// One node: receives the trainer's messages, drives and supervises its env workers.
pub struct Node {
    machine: NodeMachine,
    workers: Vec<Addr<EnvWorker>>,
    trainer: Recipient<FromNodeMsg>,
    out: Vec<NodeOutput>,
    rebuild: Option<Rebuild>,
    /// Workers whose actor was found dead and reported, until replaced.
    dead: Vec<bool>,
    /// Origin of the times given to the machine.
    start: Instant,
}

impl Node {
    /// A node over already started workers, reporting to `trainer`. Without
    /// [`Self::with_rebuild`] a failed worker cannot be rebuilt: each attempt counts
    /// as one more failure, so the node fails once the restart intensity is spent.
    pub fn new(machine: NodeMachine, workers: Vec<Addr<EnvWorker>>, trainer: Recipient<FromNodeMsg>) -> Node {
        Node {
            machine,
            workers,
            trainer,
            out: Vec::new(),
            rebuild: None,
            dead: Vec::new(),
            start: Instant::now(),
        }
    }

    /// Lets the node rebuild a failed worker `w` from `spec` and `registry`
    /// (`spec.build_worker(registry, w)`); `arbiters[w]` is the arbiter worker `w`
    /// runs on, where a new worker actor is started if the old one died.
    pub fn with_rebuild(mut self, spec: NodeSpec, registry: Registry, arbiters: Vec<ArbiterHandle>) -> Node {
        self.rebuild = Some(Rebuild {
            spec,
            registry,
            arbiters,
        });
        self
    }

    fn dispatch(&mut self, ctx: &mut Context<Self>) {
        // Sending can produce more outputs (a dead worker, a failed rebuild): loop until none.
        while !self.out.is_empty() {
            let outs = std::mem::take(&mut self.out);
            for o in outs {
                match o {
                    NodeOutput::Worker { worker, cmd } => self.send_worker(worker, cmd),
                    NodeOutput::Trainer(m) => self.trainer.do_send(FromNodeMsg(m)),
                    NodeOutput::RestartWorker {
                        worker,
                        restart,
                        seed,
                        skip_traj_ids_below,
                        frames,
                        weights,
                        cause,
                    } => {
                        let built = self.build(worker, seed, skip_traj_ids_below, frames, weights);
                        match built {
                            Ok(rollout) => self.replace(worker, restart, rollout, ctx),
                            Err(e) => {
                                let reason = format!("rebuild after `{cause}` failed: {e}");
                                tracing::error!(node = self.machine.index(), worker, restart, %reason, "env worker rebuild failed");
                                let now = self.start.elapsed();
                                self.machine.on_worker_failed(worker, &reason, now, &mut self.out);
                            }
                        }
                    }
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
            w.do_send(ToWorker(cmd));
            return;
        }
        // The actor is gone (a panic outside the env boundary): a death, reported once.
        if self.dead.len() < self.workers.len() {
            self.dead.resize(self.workers.len(), false);
        }
        match cmd {
            WorkerCmd::Stop => self.machine.on_worker_stopped(worker, &mut self.out),
            // Its storage goes with it; its commands are asked again after the restart.
            _ if self.dead[worker] => {}
            WorkerCmd::Recycle(_) => {}
            _ => {
                self.dead[worker] = true;
                let now = self.start.elapsed();
                self.machine
                    .on_worker_failed(worker, "the env worker actor died (mailbox closed)", now, &mut self.out);
            }
        }
    }

    fn build(
        &self,
        worker: usize,
        seed: u64,
        skip: u64,
        frames: u64,
        weights: Option<Arc<Weights>>,
    ) -> Result<rollout::rollout::Rollout, String> {
        let Some(rb) = &self.rebuild else {
            return Err("this node has no spec to rebuild workers from".into());
        };
        rb.spec
            .rebuild_worker(&rb.registry, worker, seed, skip, frames, weights.as_deref())
            .map_err(|e| e.to_string())
    }

    fn replace(&mut self, worker: usize, restart: u32, rollout: rollout::rollout::Rollout, ctx: &mut Context<Self>) {
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
        let Some(arbiter) = self.rebuild.as_ref().and_then(|rb| rb.arbiters.get(worker)) else {
            let now = self.start.elapsed();
            self.machine.on_worker_failed(
                worker,
                "the env worker actor died and has no arbiter",
                now,
                &mut self.out,
            );
            return;
        };
        let to_node = ctx.address().recipient();
        self.workers[worker] =
            EnvWorker::start_in_arbiter(arbiter, move |_| EnvWorker::new(worker, rollout, to_node, true));
        if let Some(d) = self.dead.get_mut(worker) {
            *d = false;
        }
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

impl Handler<ToNodeMsg> for Node {
    type Result = ();

    fn handle(&mut self, msg: ToNodeMsg, ctx: &mut Self::Context) {
        if let Err(e) = self.machine.handle(msg.0, &mut self.out) {
            tracing::warn!(node = self.machine.index(), error = %e, "node refused a message");
        }
        self.dispatch(ctx);
    }
}

impl Handler<WorkerEvent> for Node {
    type Result = ();

    fn handle(&mut self, ev: WorkerEvent, ctx: &mut Self::Context) {
        let r = match ev {
            WorkerEvent::Batch {
                worker,
                seq,
                version,
                data,
            } => self.machine.on_worker_batch(worker, seq, version, data, &mut self.out),
            WorkerEvent::Failed { worker, reason } => {
                let now = self.start.elapsed();
                self.machine.on_worker_failed(worker, &reason, now, &mut self.out);
                Ok(())
            }
            WorkerEvent::Stopped { worker } => {
                self.machine.on_worker_stopped(worker, &mut self.out);
                Ok(())
            }
            WorkerEvent::Snapshot { worker, state } => {
                self.machine
                    .on_worker_snapshot(worker, state.map(|s| *s), &mut self.out)
            }
            WorkerEvent::Restored { worker, result } => self.machine.on_worker_restored(worker, result, &mut self.out),
        };
        if let Err(e) = r {
            tracing::warn!(node = self.machine.index(), error = %e, "node dropped a worker answer");
        }
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
        ctx.stop();
    }
}
