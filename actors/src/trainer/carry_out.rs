//! Carrying out what the machine says: its outputs (sends, yields, replies,
//! restarts) and its verdicts on its own errors ([`Verdict`]), the consumer's waits
//! and the run's failure. Nothing here decides: the machine did.

#[cfg(doc)]
use rollout::machine::TrainerMachine;
use rollout::machine::{Collected, Output, TrainerError, Verdict};

use super::{Overdue, Trainer};
use crate::error::CollectError;
use crate::messages::TrainerEvent;
use crate::metrics::FailureReason;

impl Trainer {
    /// Acts on what the machine said about a node message, tick or restart.
    pub(super) fn on_result(&mut self, r: Result<(), TrainerError>) {
        let verdict = self.machine.verdict(r);
        self.carry_out(verdict);
    }

    /// Carries out the machine's verdict on one of its answers: fails the run, closes
    /// a node's connection, counts, logs.
    pub(super) fn carry_out(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Fine => {}
            Verdict::NodeFailed { node, reason } => {
                self.dispatch();
                self.fail(CollectError::NodeFailed { node, reason });
            }
            Verdict::RunFailed(e) => {
                self.dispatch();
                self.fail(e.into());
            }
            Verdict::JoinRefused { node, error } => {
                self.count_refusal();
                tracing::warn!(%error, "node refused");
                self.close_node(node, error.to_string());
            }
            Verdict::NodeLost { node, reason, expected } => {
                self.count_failure(node, FailureReason::Lost);
                if expected {
                    tracing::warn!(node, %reason, "node lost; the others go on");
                } else {
                    tracing::error!(node, %reason, "node lost; the others go on");
                }
                // Dropped for good: a remote node's connection is closed with the reason.
                self.close_node(node, format!("dropped: {reason}"));
            }
            Verdict::ProtocolViolation { node, error } => {
                self.count_failure(node, FailureReason::Protocol);
                tracing::warn!(%error, "trainer dropped a node message");
                self.close_node(node, error.to_string());
            }
            Verdict::Dropped(error) => tracing::warn!(%error, "trainer dropped a node message"),
        }
    }

    /// Moves the machine's clock to now, so that what is sent next is timed from
    /// now, and acts on the deadlines that passed (see [`TrainerMachine::tick`]).
    pub(super) fn tick(&mut self) {
        let r = self.machine.tick(self.start.elapsed(), &mut self.out);
        self.on_result(r);
        for (node, reason) in self.machine.take_abandoned() {
            tracing::warn!(node, %reason, "node closed at shutdown: past its deadline, it counts as down");
            self.close_node(node, reason);
        }
    }

    pub(super) fn dispatch(&mut self) {
        // Delivering a batch to a subscriber asks the machine for the next one, which
        // appends more output: loop until nothing is left, or it would wait for the
        // next message to the trainer (forever, in sync push mode).
        while !self.out.is_empty() {
            self.dispatch_once();
        }
    }

    pub(super) fn dispatch_once(&mut self) {
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
                Output::DroppedLagging { frames, .. } => {
                    if let Some(m) = &self.metrics {
                        m.dropped_lagging(frames);
                    }
                }
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

    pub(super) fn deliver(&mut self, r: Result<Option<Collected>, CollectError>) {
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

    pub(super) fn fail(&mut self, e: CollectError) {
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

    /// Begins a wait of the consumer for a batch: past the delivery's `batch_timeout`
    /// it is told so ([`Overdue`]), unless a batch, the end or an error came first.
    pub(super) fn begin_wait(&mut self) {
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

    /// The error of the consumer's wait for `what` that ran out after `seconds`: when a
    /// node cut off from the run has not come back, that is why, and the error is its
    /// failure, naming the node, the cause of the cut and how long it was waited for;
    /// else the timeout itself.
    pub(super) fn late(&self, what: &'static str, seconds: f64) -> CollectError {
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

    pub(super) fn restart_node(&mut self, node: usize, restart: u32, cause: String) {
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

    /// Cuts node `node`'s connection, if it is remote, for `reason`.
    pub(super) fn close_node(&self, node: usize, reason: String) {
        if let Some(Some(link)) = self.nodes.get(node) {
            link.close(reason);
        }
    }

    pub(super) fn recycle(&mut self, node: Option<usize>, data: rollout::TensorDict) {
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

    /// Counts a failure of `node` for `reason`, when metrics are on.
    pub(super) fn count_failure(&mut self, node: usize, reason: FailureReason) {
        if let Some(m) = &mut self.metrics {
            m.failed(node, reason);
        }
    }

    /// Counts a join the machine refused (elastic: a held slot), when metrics are on.
    pub(super) fn count_refusal(&self) {
        if let Some(m) = &self.metrics {
            m.refused();
        }
    }
}
