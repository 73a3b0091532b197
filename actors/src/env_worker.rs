//! The env-worker actor: owns one [`Rollout`] and steps it on its own arbiter thread.
//!
//! Collection runs inside the handler: the worker's thread is its own, so a
//! batch being collected blocks nobody else. Env and policy code is run under
//! `catch_unwind`: a panic there becomes a `Failed` event. After any failure
//! (error or panic) the rollout is dropped, never used again: the worker answers
//! `Failed` once, then ignores commands until its node sends a [`Replace`] with a
//! rollout rebuilt from the spec (fresh state, as an OTP restart).
//!
//! A batch runs inside one handler, so a `Stop` queues behind it: the worker also
//! holds its node's stop flag, which the collection loop looks at between steps
//! ([`Rollout::collect_frames_until`]). Once the node sets it, the batch in flight
//! ends within [`STOP_CHECK_STEPS`](rollout::rollout::STOP_CHECK_STEPS) steps and is
//! dropped, answered by nothing: the `Stop` that follows is answered as usual.
//!
//! The storage of its batches comes back beside the mailbox, in a [`Returned`] slot
//! it shares with its node, taken at each `Collect`: with `prefetch` the next
//! `Collect` is queued before the last batch is handed back, and through the mailbox
//! that storage would come only after the batch it could have held.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};

use actix::prelude::*;
use rollout::machine::node::WorkerEvent;
use rollout::machine::WorkerCmd;
use rollout::rollout::{Rollout, RolloutError};
use rollout::TensorDict;

use crate::messages::{Deliver, Replace};

/// One env worker of a node.
pub struct EnvWorker {
    worker: usize,
    rollout: Option<Rollout>,
    node: Recipient<Deliver<WorkerEvent>>,
    /// Stop the arbiter thread too when the actor stops (it owns the thread).
    owns_arbiter: bool,
    /// Set by the node when it stops: the batch in flight ends between steps.
    stop: Arc<AtomicBool>,
    /// Storage its node handed back, taken at the next `Collect`.
    returned: Returned,
}

/// The storage of a worker's last batch, handed back by its node and taken by the
/// worker when it begins its next `Collect` (see the module's doc). Holds one batch:
/// a newer one replaces it (the rollout keeps one spare anyway).
#[derive(Clone, Debug, Default)]
pub struct Returned(Arc<Mutex<Option<TensorDict>>>);

impl Returned {
    /// Hands `data` back.
    pub fn put(&self, data: TensorDict) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(data);
    }

    /// What was handed back since the last take.
    fn take(&self) -> Option<TensorDict> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl EnvWorker {
    /// A worker that reports to `node`.
    pub fn new(
        worker: usize,
        rollout: Rollout,
        node: Recipient<Deliver<WorkerEvent>>,
        owns_arbiter: bool,
    ) -> EnvWorker {
        EnvWorker {
            worker,
            rollout: Some(rollout),
            node,
            owns_arbiter,
            stop: Arc::new(AtomicBool::new(false)),
            returned: Returned::default(),
        }
    }

    /// The slot its node hands its batches' storage back in ([`Returned`]); without
    /// it, storage comes as `Recycle` commands in the mailbox.
    pub fn with_returned(mut self, returned: Returned) -> EnvWorker {
        self.returned = returned;
        self
    }

    /// The worker looks at `stop` while it collects (its node's flag, see
    /// [`crate::node::Node::with_stop_flag`]); without it a batch runs to its end.
    pub fn with_stop_flag(mut self, stop: Arc<AtomicBool>) -> EnvWorker {
        self.stop = stop;
        self
    }
}

/// A new thread for one env worker, running `nice` (a Unix nice increment, clamped
/// to `0..=19`) below its process: env stepping never waits on anything, while the
/// node, its connection and the trainer are what the workers wait on.
pub fn worker_arbiter(nice: i32) -> Arbiter {
    let arbiter = Arbiter::new();
    let nice = nice.clamp(0, 19);
    if nice > 0 {
        arbiter.spawn_fn(move || lower_this_thread(nice));
    }
    arbiter
}

/// Lowers the calling thread's priority by `nice` from its process's (Linux nice
/// values are per thread). Failing to is logged and harmless.
fn lower_this_thread(nice: i32) {
    let lowered = rustix::process::getpriority_process(None).and_then(|base| {
        let target = (base + nice).clamp(-20, 19);
        rustix::process::setpriority_process(Some(rustix::thread::gettid()), target)
    });
    if let Err(e) = lowered {
        tracing::debug!(nice, error = %e, "could not lower an env worker's priority");
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

/// Runs one command on a worker's rollout: the whole of a worker's logic, shared
/// by the actor and the testkit. A failure (an error, or a panic: its state is
/// suspect) drops the rollout and answers `Failed`; with no rollout, commands are
/// ignored until the node replaces it (the failure was reported once already);
/// `Stop` drops it and answers `Stopped`.
pub fn execute(rollout: &mut Option<Rollout>, worker: usize, cmd: WorkerCmd) -> Option<WorkerEvent> {
    execute_until(rollout, worker, cmd, &AtomicBool::new(false))
}

/// [`execute`], with a `Collect` that ends between steps once `stop` is set: the
/// partial batch is dropped and nothing is answered (not a failure; the node is
/// stopping, and its `Stop` comes next). The rollout is dropped with it.
pub fn execute_until(
    rollout: &mut Option<Rollout>,
    worker: usize,
    cmd: WorkerCmd,
    stop: &AtomicBool,
) -> Option<WorkerEvent> {
    if let WorkerCmd::Stop = cmd {
        *rollout = None;
        return Some(WorkerEvent::Stopped { worker });
    }
    let r = rollout.as_mut()?;
    let result = catch_unwind(AssertUnwindSafe(|| match cmd {
        WorkerCmd::Collect { seq, frames } => r.collect_frames_until(frames, stop).map(|data| {
            let max = r.batch_max_traj_id();
            Some(WorkerEvent::batch_with_max(worker, seq, r.weights().version, data, max))
        }),
        WorkerCmd::SetWeights(w) => r.set_shared_weights(&w).map(|_| None),
        WorkerCmd::Seed { seed } => {
            r.set_seed(seed);
            Ok(None)
        }
        WorkerCmd::Recycle(data) => {
            r.recycle(data);
            Ok(None)
        }
        // A checkpoint the rollout cannot take (or a state it refuses) is an answer,
        // not a failure: the rollout is untouched and goes on.
        WorkerCmd::Snapshot => Ok(Some(WorkerEvent::Snapshot {
            worker,
            state: r.snapshot().map(Box::new).map_err(|e| e.to_string()),
        })),
        WorkerCmd::Restore(state) => Ok(Some(WorkerEvent::Restored {
            worker,
            result: r.restore(&state).map_err(|e| e.to_string()),
        })),
        WorkerCmd::Stop => Ok(None),
    }));
    match result {
        Ok(Ok(ev)) => ev,
        Ok(Err(RolloutError::Stopped)) => {
            *rollout = None;
            None
        }
        Ok(Err(e)) => {
            *rollout = None;
            Some(WorkerEvent::Failed {
                worker,
                reason: e.to_string(),
            })
        }
        Err(p) => {
            *rollout = None;
            Some(WorkerEvent::Failed {
                worker,
                reason: format!("panic: {}", panic_message(p.as_ref())),
            })
        }
    }
}

impl Handler<Deliver<WorkerCmd>> for EnvWorker {
    type Result = ();

    fn handle(&mut self, msg: Deliver<WorkerCmd>, ctx: &mut Self::Context) {
        let stop = matches!(msg.0, WorkerCmd::Stop);
        if let (WorkerCmd::Collect { .. }, Some(r)) = (&msg.0, self.rollout.as_mut()) {
            if let Some(data) = self.returned.take() {
                r.recycle(data);
            }
        }
        if let Some(ev) = execute_until(&mut self.rollout, self.worker, msg.0, &self.stop) {
            if let WorkerEvent::Failed { reason, .. } = &ev {
                tracing::warn!(worker = self.worker, %reason, "env worker failed");
            }
            self.node.do_send(Deliver(ev));
        }
        if stop {
            ctx.stop();
        }
    }
}

impl Handler<Replace> for EnvWorker {
    type Result = ();

    fn handle(&mut self, msg: Replace, _ctx: &mut Self::Context) {
        self.rollout = Some(msg.0);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::worker_arbiter;

    #[test]
    fn a_worker_thread_runs_its_nice_increment_below_its_process() {
        actix_rt::System::new().block_on(async {
            let base = rustix::process::getpriority_process(None).expect("getpriority");
            let arbiter = worker_arbiter(3);
            let (tx, rx) = std::sync::mpsc::channel();
            // Runs after the lowering, which was spawned on the arbiter first.
            arbiter.spawn_fn(move || {
                let _ = tx.send(rustix::process::getpriority_process(None));
            });
            let seen = rx.recv_timeout(Duration::from_secs(10)).expect("the arbiter answers");
            arbiter.stop();
            assert_eq!(seen.ok(), Some((base + 3).min(19)));
        });
    }
}
