//! The Node actor: a thin shell around [`NodeMachine`] that owns its env workers.

use actix::prelude::*;
use rollout::machine::{NodeMachine, NodeOutput};

use crate::env_worker::EnvWorker;
use crate::messages::{FromNodeMsg, Recycle, ToNodeMsg, ToWorker, WorkerEvent};

/// One node: receives the trainer's messages, drives its env workers.
pub struct Node {
    machine: NodeMachine,
    workers: Vec<Addr<EnvWorker>>,
    trainer: Recipient<FromNodeMsg>,
    out: Vec<NodeOutput>,
}

impl Node {
    /// A node over already started workers, reporting to `trainer`.
    pub fn new(machine: NodeMachine, workers: Vec<Addr<EnvWorker>>, trainer: Recipient<FromNodeMsg>) -> Node {
        Node {
            machine,
            workers,
            trainer,
            out: Vec::new(),
        }
    }

    fn dispatch(&mut self, ctx: &mut Context<Self>) {
        for o in self.out.drain(..) {
            match o {
                NodeOutput::Worker { worker, cmd } => match self.workers.get(worker) {
                    Some(w) => w.do_send(ToWorker(cmd)),
                    None => tracing::error!(node = self.machine.index(), worker, "no such worker"),
                },
                NodeOutput::Trainer(m) => self.trainer.do_send(FromNodeMsg(m)),
            }
        }
        if self.machine.is_down() {
            ctx.stop();
        }
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
                self.machine.on_worker_failed(worker, &reason, &mut self.out);
                Ok(())
            }
            WorkerEvent::Stopped { worker } => {
                self.machine.on_worker_stopped(worker, &mut self.out);
                Ok(())
            }
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
