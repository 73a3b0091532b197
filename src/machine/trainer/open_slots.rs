//! Slots of nodes that join on their own (the external launcher): a failure there is
//! the failure of the peer that held the slot, not a crash loop of a node the trainer
//! started. The slot is freed for the next node to join (a restart, without counting
//! against the restart intensity), so one token holder that joins and misbehaves
//! again and again cannot end a run it does not own:
//! - async: the run goes on with its healthy nodes, whatever happens to the slot;
//! - sync: the run waits for a node in the slot to deliver, at most
//!   [`NodeSupervision::open_slot_wait`](super::NodeSupervision::open_slot_wait) from
//!   the slot's first failure since its last accepted batch (a refused joiner does not
//!   restart that wait), then fails naming the slot and the refusals.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Output, TrainerError, TrainerMachine};

/// Causes kept per open slot, for the error that names them (the latest ones).
pub(super) const CAUSES_KEPT: usize = 4;

/// A slot whose node failed and that no node has delivered in since.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct OpenSlot {
    /// The first failure since the slot's last accepted batch (machine clock).
    since: Duration,
    /// Failures since then.
    failures: u32,
    /// The latest causes, oldest first.
    causes: VecDeque<String>,
}

impl OpenSlot {
    fn new(since: Duration) -> OpenSlot {
        OpenSlot {
            since,
            failures: 0,
            causes: VecDeque::new(),
        }
    }

    fn note(&mut self, cause: String) {
        self.failures = self.failures.saturating_add(1);
        if self.causes.len() == CAUSES_KEPT {
            self.causes.pop_front();
        }
        self.causes.push_back(cause);
    }

    /// Why a sync run gives up on slot `node`, `waited` after its first failure, having
    /// waited up to `wait`: in the words of [`CutOff::not_back`](super::CutOff::not_back)
    /// (the latest cause, the wait), then the slot's failures.
    fn given_up(&self, node: usize, wait: Duration, waited: Duration) -> String {
        let shown = self.causes.len();
        let earlier = (self.failures as usize).saturating_sub(shown);
        let earlier = if earlier > 0 {
            format!("{earlier} earlier not shown; ")
        } else {
            String::new()
        };
        let causes: Vec<&str> = self.causes.iter().map(String::as_str).collect();
        let cut = super::CutOff {
            node,
            cause: self.causes.back().cloned().unwrap_or_default(),
            at: self.since,
        };
        format!(
            "{}: no node delivered in slot {node} within {:.1} s of its first failure \
             ({} failures or refusals of the peers that joined it: {earlier}{})",
            cut.not_back(waited),
            wait.as_secs_f64(),
            self.failures,
            causes.join("; ")
        )
    }
}

impl TrainerMachine {
    /// How long a sync run waits for an open slot, when nodes join on their own.
    pub(super) fn open_slot_wait(&self) -> Option<Duration> {
        self.supervision.as_ref().and_then(|s| s.open_slot_wait)
    }

    /// Node `node`, which joined on its own, failed for `cause` (it is down now): its
    /// slot is freed for the next joiner, its frames `lost` held for it; a sync run
    /// that has waited too long for the slot fails instead.
    pub(super) fn open_slot(
        &mut self,
        node: usize,
        cause: String,
        lost: Option<usize>,
        out: &mut Vec<Output>,
    ) -> Result<(), TrainerError> {
        let now = self.now;
        let slot = self.open_slots[node].get_or_insert_with(|| OpenSlot::new(now));
        slot.note(cause.clone());
        if let Some(reason) = self.open_slot_overdue(node) {
            return Err(TrainerError::NodeFailed { node, reason });
        }
        // The slot's wait is a deadline the next tick must look at.
        self.quiet_until = Duration::ZERO;
        let restart = self.restarts[node].record_unlimited(now, cause.clone());
        tracing::warn!(node, restart, %cause, "node failed; its slot is open for the next node to join");
        self.restart_node(node, restart, cause, lost, out)
    }

    /// Sync: why the run gives up on slot `node`, open for longer than it waits.
    fn open_slot_overdue(&self, node: usize) -> Option<String> {
        let wait = self.open_slot_wait()?;
        let slot = self.open_slots.get(node)?.as_ref()?;
        let waited = self.now.saturating_sub(slot.since);
        (self.cfg.sync() && waited >= wait).then(|| slot.given_up(node, wait, waited))
    }

    /// Sync: fails the run once a slot has been open for longer than it waits.
    pub(super) fn check_open_slots(&mut self) -> Result<(), TrainerError> {
        if self.shutting_down || !self.cfg.sync() {
            return Ok(());
        }
        for node in 0..self.open_slots.len() {
            if !self.nodes[node].state.is_restarting() {
                continue;
            }
            if let Some(reason) = self.open_slot_overdue(node) {
                self.nodes[node].state.lose();
                return Err(TrainerError::NodeFailed { node, reason });
            }
        }
        Ok(())
    }

    /// The earliest time an open slot's wait ends (sync), for the tick's quiet period.
    pub(super) fn open_slots_deadline(&self) -> Option<Duration> {
        let wait = self.open_slot_wait().filter(|_| self.cfg.sync())?;
        self.open_slots
            .iter()
            .flatten()
            .map(|s| s.since.saturating_add(wait))
            .min()
    }

    /// A batch of node `node` was accepted: its slot is healthy again.
    pub(super) fn slot_delivered(&mut self, node: usize) {
        if let Some(s) = self.open_slots.get_mut(node) {
            *s = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::message::FromNode;

    /// Supervision of nodes that join on their own, waiting `wait_ms` for a slot; an
    /// intensity of 3 in an hour, which the joiners' failures must not reach.
    fn joined(m: TrainerMachine, wait_ms: u64) -> TrainerMachine {
        let mut sup = supervision(3, None);
        sup.open_slot_wait = Some(ms(wait_ms));
        m.with_supervision(sup)
    }

    fn refused(node: usize, i: usize) -> FromNode {
        FromNode::Failed {
            node,
            reason: format!("bad ready {i}"),
        }
    }

    /// A new node joined the open slot `node` (the launcher's `NodeRestarted`).
    fn rejoin(m: &mut TrainerMachine, node: usize) -> Vec<Output> {
        let mut out = Vec::new();
        m.node_restarted(node, &mut out).expect("rejoined");
        out
    }

    #[test]
    fn async_a_peer_failing_again_and_again_never_ends_the_run_and_the_others_go_on() {
        let mut m = joined(machine(config(3, 1, 4, None, false)), 60_000);
        request(&mut m);
        for i in 0..10 {
            m.tick(ms(20 * i as u64), &mut Vec::new()).unwrap();
            let mut out = Vec::new();
            m.on_node(refused(2, i), &mut out)
                .expect("the slot's failure is the peer's");
            assert!(matches!(&out[..], [Output::RestartNode { node: 2, .. }]), "{out:?}");
            rejoin(&mut m, 2);
        }
        // Far past the wait, the healthy nodes still collect.
        m.tick(ms(3_600_000), &mut Vec::new()).unwrap();
        let out = feed(&mut m, batch(0, 0, 1, 4));
        assert_eq!(yields(&out).len(), 1);
        assert_eq!(m.nodes_alive(), 3);
    }

    #[test]
    fn async_a_slot_no_one_rejoins_is_given_up_without_ending_the_run() {
        let mut m = joined(machine(config(3, 1, 4, None, false)), 60_000);
        request(&mut m);
        feed(&mut m, refused(2, 0));
        let r = m.node_restart_failed(2, "no node rejoined".into(), &mut Vec::new());
        assert!(matches!(r, Err(TrainerError::NodeLost { node: 2, .. })), "{r:?}");
        let out = feed(&mut m, batch(1, 1, 1, 4));
        assert_eq!(yields(&out).len(), 1, "the run goes on with nodes 0 and 1");
    }

    #[test]
    fn sync_waits_for_the_slot_from_its_first_failure_then_fails_naming_the_refusals() {
        let mut m = joined(machine(config(2, 1, 8, None, true)), 1_000);
        request(&mut m);
        feed(&mut m, batch(0, 0, 1, 4));
        for i in 0..4 {
            m.tick(ms(200 * i as u64), &mut Vec::new()).unwrap();
            let mut out = Vec::new();
            m.on_node(refused(1, i), &mut out).expect("within the wait");
            rejoin(&mut m, 1);
        }
        m.tick(ms(900), &mut Vec::new()).unwrap();
        feed(&mut m, refused(1, 4));
        // A refused joiner does not restart the wait: it ends 1 s after the first failure.
        let r = m.tick(ms(1_000), &mut Vec::new());
        match r {
            Err(TrainerError::NodeFailed { node: 1, reason }) => {
                assert!(reason.contains("slot 1 within 1.0 s"), "{reason}");
                assert!(reason.contains("5 failures"), "{reason}");
                assert!(reason.contains("bad ready 4"), "{reason}");
            }
            other => panic!("expected the slot to be given up, got {other:?}"),
        }
    }

    #[test]
    fn sync_a_slot_that_delivers_is_healthy_again_and_its_wait_starts_over() {
        let mut m = joined(machine(config(2, 1, 8, None, true)), 1_000);
        request(&mut m);
        feed(&mut m, refused(1, 0));
        let out = rejoin(&mut m, 1);
        let (_, seq, frames) = continues(&out)[0];
        feed(&mut m, batch(0, 0, 1, 4));
        let out = feed(&mut m, batch(1, seq, 1, frames));
        assert_eq!(yields(&out).len(), 1);
        // Much later, a new failure opens the slot anew: the wait counts from it.
        m.tick(ms(5_000), &mut Vec::new()).unwrap();
        request(&mut m);
        feed(&mut m, refused(1, 1));
        m.tick(ms(5_900), &mut Vec::new()).expect("0.9 s into the new wait");
        assert!(m.tick(ms(6_000), &mut Vec::new()).is_err(), "1 s into it");
    }

    #[test]
    fn launcher_started_nodes_keep_the_restart_intensity() {
        let mut m = machine(config(2, 1, 4, None, false)).with_supervision(supervision(3, None));
        request(&mut m);
        for i in 0..3 {
            feed(&mut m, refused(1, i));
            rejoin(&mut m, 1);
        }
        let r = m.on_node(refused(1, 3), &mut Vec::new());
        assert!(matches!(r, Err(TrainerError::NodeFailed { node: 1, .. })), "{r:?}");
    }

    #[test]
    fn a_given_up_slot_names_the_wait_the_count_and_the_latest_causes() {
        let mut s = OpenSlot::new(Duration::from_secs(1));
        for i in 0..6 {
            s.note(format!("cause {i}"));
        }
        let text = s.given_up(2, Duration::from_secs(60), Duration::from_secs(61));
        assert!(
            text.starts_with("cut off for: cause 5; not back 61.0 s later: "),
            "{text}"
        );
        assert!(text.contains("slot 2 within 60.0 s"), "{text}");
        assert!(text.contains("6 failures"), "{text}");
        assert!(
            text.contains("2 earlier not shown; cause 2; cause 3; cause 4; cause 5"),
            "{text}"
        );
        assert!(!text.contains("cause 1;"), "{text}");
    }
}
