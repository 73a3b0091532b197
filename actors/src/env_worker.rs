//! The env-worker actor: owns one [`Rollout`] and steps it on its own arbiter thread.
//!
//! Collection runs inside the handler: the worker's thread is its own, so a
//! batch being collected blocks nobody else. Env and policy code is run under
//! `catch_unwind`: a panic there becomes a `Failed` event, and the rollout it
//! poisoned is dropped, never used again.

use std::panic::{catch_unwind, AssertUnwindSafe};

use actix::prelude::*;
use rollout::machine::WorkerCmd;
use rollout::rollout::Rollout;

use crate::messages::{ToWorker, WorkerEvent};

/// One env worker of a node.
pub struct EnvWorker {
    worker: usize,
    rollout: Option<Rollout>,
    node: Recipient<WorkerEvent>,
    /// Stop the arbiter thread too when the actor stops (it owns the thread).
    owns_arbiter: bool,
}

impl EnvWorker {
    /// A worker that reports to `node`.
    pub fn new(worker: usize, rollout: Rollout, node: Recipient<WorkerEvent>, owns_arbiter: bool) -> EnvWorker {
        EnvWorker {
            worker,
            rollout: Some(rollout),
            node,
            owns_arbiter,
        }
    }

    fn fail(&mut self, reason: String) {
        tracing::warn!(worker = self.worker, %reason, "env worker failed");
        self.node.do_send(WorkerEvent::Failed {
            worker: self.worker,
            reason,
        });
    }
}

impl Actor for EnvWorker {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        if self.owns_arbiter {
            Arbiter::current().stop();
        }
    }
}

/// The text of a caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

impl Handler<ToWorker> for EnvWorker {
    type Result = ();

    fn handle(&mut self, msg: ToWorker, ctx: &mut Self::Context) {
        if let WorkerCmd::Stop = msg.0 {
            self.rollout = None;
            self.node.do_send(WorkerEvent::Stopped { worker: self.worker });
            ctx.stop();
            return;
        }
        let Some(rollout) = self.rollout.as_mut() else {
            self.fail("the worker's env was lost to an earlier panic".into());
            return;
        };
        let result = catch_unwind(AssertUnwindSafe(|| match msg.0 {
            WorkerCmd::Collect { seq, frames } => rollout.collect_frames(frames).map(|data| {
                Some(WorkerEvent::Batch {
                    worker: self.worker,
                    seq,
                    version: rollout.weights().version,
                    data,
                })
            }),
            WorkerCmd::SetWeights(w) => rollout.set_weights(&w).map(|_| None),
            WorkerCmd::Seed { seed } => {
                rollout.set_seed(seed);
                Ok(None)
            }
            WorkerCmd::Stop => Ok(None),
        }));
        match result {
            Ok(Ok(Some(ev))) => self.node.do_send(ev),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => self.fail(e.to_string()),
            Err(p) => {
                self.rollout = None;
                self.fail(format!("panic: {}", panic_message(p.as_ref())));
            }
        }
    }
}
