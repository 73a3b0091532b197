//! A deadline on every request the trainer sends a node: `seed`, `update_weights`,
//! `snapshot`/`restore` and the shutdown acknowledgement here (`continue` is timed
//! in `supervise.rs` from the node's state). Each request that awaits an answer is
//! booked with the time it was sent; [`TrainerMachine::tick`] fails a node whose
//! oldest unanswered request is past its deadline, as any other node failure
//! (restarted under supervision, else dropped with the reason). At shutdown a node
//! past its deadline is given up with a warning instead: the run is complete.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use super::{Output, TrainerError, TrainerMachine};
use crate::message::ToNode;

/// How long a node may take to answer each request; `None`: no limit. The
/// machine's own default is no limit on anything; the collector's builder sets
/// its defaults (see `CollectorBuilder::request_timeout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestDeadlines {
    /// `seed`, answered by `seeded`.
    pub seed: Option<Duration>,
    /// `update_weights`, answered by `weights_updated`.
    pub update_weights: Option<Duration>,
    /// `snapshot` and `restore`, answered by `snapshot`, `restored` or `checkpoint_failed`.
    pub checkpoint: Option<Duration>,
    /// `continue`, answered by its `batch` (with supervision's `continue_timeout`,
    /// the shorter one counts).
    pub batch: Option<Duration>,
    /// `shutdown`, answered by `down`; past it the node is closed with a warning.
    pub shutdown: Option<Duration>,
}

/// A request that awaits an answer (`continue` is timed by the node's state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Request {
    /// `seed`.
    Seed,
    /// `update_weights` of this version.
    UpdateWeights(u64),
    /// `snapshot` for this checkpoint id.
    Snapshot(u64),
    /// `restore`.
    Restore,
    /// `shutdown`.
    Shutdown,
}

impl Request {
    /// The request `msg` makes, if it awaits an answer other than a batch.
    fn of(msg: &ToNode) -> Option<Request> {
        match msg {
            ToNode::Seed(_) => Some(Request::Seed),
            ToNode::UpdateWeights(u) => Some(Request::UpdateWeights(u.weights.version)),
            ToNode::Snapshot { id } => Some(Request::Snapshot(*id)),
            ToNode::Restore(_) => Some(Request::Restore),
            ToNode::Shutdown => Some(Request::Shutdown),
            _ => None,
        }
    }

    /// Same kind of request (what one answer clears).
    fn same_kind(self, other: Request) -> bool {
        std::mem::discriminant(&self) == std::mem::discriminant(&other)
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Seed => write!(f, "seed"),
            Request::UpdateWeights(v) => write!(f, "update_weights (version {v})"),
            Request::Snapshot(id) => write!(f, "snapshot (checkpoint {id})"),
            Request::Restore => write!(f, "restore"),
            Request::Shutdown => write!(f, "shutdown"),
        }
    }
}

/// A request sent and not answered yet, with when it was sent (machine clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Awaited {
    /// What was asked.
    pub(super) request: Request,
    /// When.
    pub(super) since: Duration,
}

/// One node's unanswered requests, oldest first (a node answers in order).
pub(super) type AwaitedList = VecDeque<Awaited>;

impl TrainerMachine {
    /// Sets how long a node may take to answer each request.
    pub fn with_deadlines(mut self, deadlines: RequestDeadlines) -> TrainerMachine {
        self.deadlines = deadlines;
        self.quiet_until = Duration::ZERO;
        self
    }

    /// How long a node may take to answer each request.
    pub fn deadlines(&self) -> &RequestDeadlines {
        &self.deadlines
    }

    /// Nodes given up at shutdown since the last call, with why: they did not
    /// acknowledge `shutdown` in time and count as down; their connections are to be
    /// closed.
    pub fn take_abandoned(&mut self) -> Vec<(usize, String)> {
        std::mem::take(&mut self.abandoned)
    }

    /// Sends `msg` to `node`, booking the answer it awaits.
    pub(super) fn send(&mut self, node: usize, msg: ToNode, out: &mut Vec<Output>) {
        if let Some(request) = Request::of(&msg) {
            let since = self.now;
            self.nodes[node].awaiting.push_back(Awaited { request, since });
        }
        let weights = match &msg {
            ToNode::UpdateWeights(_) => true,
            ToNode::Restore(state) => state.weights.is_some(),
            _ => false,
        };
        out.push(Output::Send { node, msg });
        self.sent(node, weights, out);
    }

    /// Node `node` answered a request like `request`: the oldest such is cleared.
    pub(super) fn request_answered(&mut self, node: usize, request: Request) {
        let list = &mut self.nodes[node].awaiting;
        if let Some(i) = list.iter().position(|a| a.request.same_kind(request)) {
            list.remove(i);
        }
    }

    /// The deadline of `request`.
    fn deadline_of(&self, request: Request) -> Option<Duration> {
        let d = &self.deadlines;
        match request {
            Request::Seed => d.seed,
            Request::UpdateWeights(_) => d.update_weights,
            Request::Snapshot(_) | Request::Restore => d.checkpoint,
            Request::Shutdown => d.shutdown,
        }
    }

    /// The first request of node `node` past its deadline at `now`, as a reason.
    fn overdue(&self, node: usize) -> Option<String> {
        self.nodes[node].awaiting.iter().find_map(|a| {
            let limit = self.deadline_of(a.request)?;
            (self.now.saturating_sub(a.since) >= limit)
                .then(|| format!("no answer to {} within {:.3} s", a.request, limit.as_secs_f64()))
        })
    }

    /// The earliest moment any deadline can pass, as the nodes stand now: the
    /// soonest of every booked request's and timed `Continue`'s deadline, and of
    /// `now` plus the shortest limit, for anything booked later (it is booked at the
    /// machine's clock, which never goes back). A lower bound: answers only push it
    /// later. `Duration::MAX` with no deadline at all.
    pub(super) fn earliest_deadline(&self) -> Duration {
        let d = &self.deadlines;
        let continue_limit = self.continue_limit();
        let limits = [d.seed, d.update_weights, d.checkpoint, d.shutdown, continue_limit];
        let open_slots = self.open_slots_deadline().unwrap_or(Duration::MAX);
        let Some(shortest) = limits.into_iter().flatten().min() else {
            return open_slots;
        };
        let mut earliest = self.now.saturating_add(shortest).min(open_slots);
        for node in self.nodes.iter().filter(|n| !n.state.is_down()) {
            for a in &node.awaiting {
                if let Some(limit) = self.deadline_of(a.request) {
                    earliest = earliest.min(a.since.saturating_add(limit));
                }
            }
            if let (Some(limit), Some(asked)) = (continue_limit, node.state.expected()) {
                earliest = earliest.min(asked.since.saturating_add(limit));
            }
        }
        earliest
    }

    /// Fails every node with a request past its deadline (see [`Self::tick`]); at
    /// shutdown, gives up every node past the shutdown deadline instead.
    pub(super) fn check_deadlines(&mut self, out: &mut Vec<Output>) -> Result<(), TrainerError> {
        for i in 0..self.nodes.len() {
            if self.nodes[i].state.is_down() {
                continue;
            }
            let Some(reason) = self.overdue(i) else {
                continue;
            };
            if self.shutting_down {
                tracing::warn!(node = i, %reason, "node given up at shutdown: past its deadline");
                self.nodes[i].state.lose();
                self.nodes[i].awaiting.clear();
                self.abandoned.push((i, reason));
                if self.all_down() {
                    out.push(Output::AllDown);
                }
                continue;
            }
            self.node_lost(i, reason, out)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::test_support::*;
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::message::FromNode;
    use crate::policy::Weights;

    fn deadline(which: fn(&mut RequestDeadlines) -> &mut Option<Duration>) -> RequestDeadlines {
        let mut d = RequestDeadlines::default();
        *which(&mut d) = Some(ms(1000));
        d
    }

    fn tick(m: &mut TrainerMachine, at: u64) -> (Vec<Output>, Result<(), TrainerError>) {
        let mut out = Vec::new();
        let r = m.tick(ms(at), &mut out);
        (out, r)
    }

    #[test]
    fn a_node_that_never_answers_seed_is_dropped_naming_the_request_and_the_chain_goes_on() {
        let mut m = machine(config(2, 1, 4, None, false)).with_deadlines(deadline(|d| &mut d.seed));
        m.set_seed(10, &mut Vec::new());
        let (out, r) = tick(&mut m, 999);
        assert!(out.is_empty() && r.is_ok(), "within the deadline: {out:?} {r:?}");
        let (out, r) = tick(&mut m, 1000);
        assert_eq!(
            r,
            Err(TrainerError::NodeLost {
                node: 0,
                reason: "no answer to seed within 1.000 s".into()
            })
        );
        assert_eq!(
            sends(&out),
            vec![(1, "seed")],
            "the chain goes on with the seed node 0 would have passed"
        );
        assert_eq!(m.nodes_alive(), 1);
        assert_eq!(
            feed(&mut m, FromNode::Seeded { node: 1, next_seed: 12 }),
            vec![Output::Seeded { next_seed: 12 }]
        );
    }

    #[test]
    fn ticks_before_the_earliest_deadline_check_nothing_and_a_request_booked_later_is_caught_on_time() {
        let mut m = machine(config(2, 1, 4, None, false)).with_deadlines(deadline(|d| &mut d.seed));
        assert_eq!(tick(&mut m, 0).1, Ok(()));
        assert_eq!(m.quiet_until, ms(1000), "nothing booked: now plus the shortest limit");
        assert_eq!(tick(&mut m, 400).1, Ok(()));
        m.set_seed(10, &mut Vec::new()); // booked at 400, due at 1400
        assert_eq!(m.quiet_until, ms(1000), "a booking does not move the bound");
        assert_eq!(tick(&mut m, 1000), (vec![], Ok(())));
        assert_eq!(m.quiet_until, ms(1400), "the seed's own deadline, found by the check");
        assert_eq!(tick(&mut m, 1399), (vec![], Ok(())));
        let (_, r) = tick(&mut m, 1400);
        assert_eq!(
            r,
            Err(TrainerError::NodeLost {
                node: 0,
                reason: "no answer to seed within 1.000 s".into()
            })
        );
        assert_eq!(
            m.quiet_until,
            Duration::ZERO,
            "after a failure the next tick checks again"
        );
        let none = machine(config(1, 1, 4, None, false));
        assert_eq!(none.earliest_deadline(), Duration::MAX, "no limit, no check ever due");
    }

    #[test]
    fn a_seed_answered_in_time_clears_its_deadline() {
        let mut m = machine(config(1, 1, 4, None, false)).with_deadlines(deadline(|d| &mut d.seed));
        m.set_seed(10, &mut Vec::new());
        feed(&mut m, FromNode::Seeded { node: 0, next_seed: 11 });
        let (out, r) = tick(&mut m, 5000);
        assert!(out.is_empty() && r.is_ok(), "{out:?} {r:?}");
    }

    #[test]
    fn a_node_past_the_update_weights_deadline_is_restarted_under_supervision() {
        let mut m = machine(config(2, 1, 4, None, false))
            .with_supervision(supervision(3, None))
            .with_deadlines(deadline(|d| &mut d.update_weights));
        m.set_weights(Weights::new(BTreeMap::new()));
        m.tick(ms(100), &mut Vec::new()).unwrap();
        m.push_weights(None, &mut Vec::new()).unwrap();
        feed(&mut m, FromNode::WeightsUpdated { node: 0, version: 1 });
        let (out, r) = tick(&mut m, 1099);
        assert!(out.is_empty() && r.is_ok(), "timed from the push: {out:?} {r:?}");
        let (out, r) = tick(&mut m, 1100);
        assert_eq!(r, Ok(()));
        assert_eq!(
            out,
            vec![Output::RestartNode {
                node: 1,
                restart: 1,
                cause: "no answer to update_weights (version 1) within 1.000 s".into()
            }]
        );
    }

    #[test]
    fn a_node_past_the_snapshot_deadline_fails_the_checkpoint_and_is_dropped() {
        let mut m = machine(config(2, 1, 4, None, false)).with_deadlines(deadline(|d| &mut d.checkpoint));
        m.begin_checkpoint(&mut Vec::new()).unwrap();
        let _ = m.on_node(
            FromNode::Snapshot {
                node: 0,
                id: 1,
                state: Box::new(node_checkpoint(0)),
            },
            &mut Vec::new(),
        );
        let (out, r) = tick(&mut m, 1000);
        assert_eq!(
            r,
            Err(TrainerError::NodeLost {
                node: 1,
                reason: "no answer to snapshot (checkpoint 1) within 1.000 s".into()
            })
        );
        assert!(
            matches!(&out[..], [Output::CheckpointFailed(why)] if why.contains("node 1 was lost")),
            "{out:?}"
        );
    }

    #[test]
    fn a_node_past_the_restore_deadline_fails_the_sync_run() {
        let mut m = machine(config(1, 1, 4, None, true)).with_deadlines(deadline(|d| &mut d.checkpoint));
        let ck = Checkpoint {
            trainer: m.trainer_state(),
            nodes: vec![node_checkpoint(0)],
        };
        m.restore(ck, &mut Vec::new()).unwrap();
        let (_, r) = tick(&mut m, 1000);
        assert_eq!(
            r,
            Err(TrainerError::NodeFailed {
                node: 0,
                reason: "no answer to restore within 1.000 s".into()
            })
        );
    }

    #[test]
    fn a_continue_deadline_without_supervision_drops_the_node_and_the_others_go_on() {
        let mut m = machine(config(2, 1, 4, None, false)).with_deadlines(deadline(|d| &mut d.batch));
        request(&mut m);
        m.tick(ms(500), &mut Vec::new()).unwrap();
        // Node 0 answers; its next Continue is timed from now.
        let out = feed(&mut m, batch(0, 0, 1, 4));
        assert_eq!(yields(&out).len(), 1);
        request(&mut m);
        let (_, r) = tick(&mut m, 1000);
        assert_eq!(
            r,
            Err(TrainerError::NodeLost {
                node: 1,
                reason: "no answer to Continue seq 1 (4 frames) within 1.000 s".into()
            })
        );
        assert_eq!(m.nodes_alive(), 1);
    }

    #[test]
    fn a_node_that_ignores_shutdown_is_given_up_with_its_reason_and_all_is_down() {
        let mut m = machine(config(2, 1, 4, None, false)).with_deadlines(deadline(|d| &mut d.shutdown));
        m.shutdown(&mut Vec::new());
        assert!(feed(&mut m, FromNode::Down { node: 0 }).is_empty());
        let (out, r) = tick(&mut m, 999);
        assert!(out.is_empty() && r.is_ok());
        let (out, r) = tick(&mut m, 1000);
        assert_eq!(r, Ok(()), "not a failure: the run is complete");
        assert_eq!(out, vec![Output::AllDown]);
        assert_eq!(
            m.take_abandoned(),
            vec![(1, "no answer to shutdown within 1.000 s".to_string())]
        );
        assert!(m.nodes_up().is_empty());
        assert!(m.take_abandoned().is_empty(), "reported once");
    }

    #[test]
    fn without_deadlines_nothing_times_out() {
        let mut m = machine(config(1, 1, 4, None, false));
        m.set_seed(0, &mut Vec::new());
        m.shutdown(&mut Vec::new());
        let (out, r) = tick(&mut m, 3_600_000);
        assert!(out.is_empty() && r.is_ok());
    }
}
