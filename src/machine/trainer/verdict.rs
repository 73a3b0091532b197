//! What an error of the machine means for the run: the one place that decides which
//! errors end the run, which lose a node, which close a node's connection and which
//! only drop a message. The Trainer actor carries the verdict out (logs, closes,
//! counts, fails its waiting requests) and decides nothing itself.

use std::time::Duration;

use super::{TrainerError, TrainerMachine};

/// What the trainer does about the machine's answer to a node's message, a tick, a
/// restart or a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Nothing went wrong.
    Fine,
    /// Node `node` failed and is not brought back: the run fails, naming the node.
    NodeFailed {
        /// The node.
        node: usize,
        /// Its failure.
        reason: String,
    },
    /// The run cannot go on (an elastic run with no node left, a policy that cannot
    /// act in the nodes' env): it fails with this error.
    RunFailed(TrainerError),
    /// A node that joined an elastic run is refused: its connection is closed with
    /// the error, and the refusal counted.
    JoinRefused {
        /// The slot it was admitted to.
        node: usize,
        /// Why (a [`TrainerError::JoinRefused`]).
        error: TrainerError,
    },
    /// Node `node` is dropped for good and the run goes on without it: its connection
    /// is closed with the reason, and the loss counted.
    NodeLost {
        /// The node.
        node: usize,
        /// Why.
        reason: String,
        /// In an elastic run nodes come and go: the loss is expected (a warning, not
        /// an error).
        expected: bool,
    },
    /// Node `node` broke the protocol (a batch not asked for, a bad batch or layout):
    /// its message is dropped, its connection closed with the error, the offence counted.
    ProtocolViolation {
        /// The node.
        node: usize,
        /// The offence.
        error: TrainerError,
    },
    /// Only the message is dropped: the node is kept, nothing is closed, the run goes
    /// on. Logged (a remote node's, within its connection's log budget).
    Dropped(TrainerError),
}

impl Verdict {
    /// The verdict on `result` in a run that is elastic (`elastic`) or not.
    pub fn of(result: Result<(), TrainerError>, elastic: bool) -> Verdict {
        let Err(e) = result else {
            return Verdict::Fine;
        };
        match e {
            TrainerError::NodeFailed { node, reason } => Verdict::NodeFailed { node, reason },
            e @ (TrainerError::NoNodes(_) | TrainerError::Policy(_)) => Verdict::RunFailed(e),
            e @ TrainerError::JoinRefused { node, .. } => Verdict::JoinRefused { node, error: e },
            TrainerError::NodeLost { node, reason } => Verdict::NodeLost {
                node,
                reason,
                expected: elastic,
            },
            e @ (TrainerError::UnexpectedBatch { node, .. }
            | TrainerError::BadBatch { node, .. }
            | TrainerError::BadLayout { node, .. }) => Verdict::ProtocolViolation { node, error: e },
            e @ (TrainerError::UnknownNode(_) | TrainerError::Checkpoint(_) | TrainerError::Tensor(_)) => {
                Verdict::Dropped(e)
            }
        }
    }
}

impl TrainerMachine {
    /// The verdict on what one of this machine's calls returned (see [`Verdict::of`]).
    pub fn verdict(&self, result: Result<(), TrainerError>) -> Verdict {
        Verdict::of(result, self.membership().is_some())
    }

    /// How often the machine must be ticked for its deadlines to be kept: a quarter of
    /// the shortest (the requests' and supervision's `continue_timeout`), within
    /// 5..=100 ms; 100 ms when there is none.
    pub fn tick_every(&self) -> Duration {
        let d = self.deadlines();
        let sup = self.supervision().and_then(|s| s.continue_timeout);
        [d.seed, d.update_weights, d.checkpoint, d.batch, d.shutdown, sup]
            .into_iter()
            .flatten()
            .min()
            .map_or(Duration::from_millis(100), |t| {
                (t / 4).clamp(Duration::from_millis(5), Duration::from_millis(100))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{config, machine, ms, supervision};
    use super::super::RequestDeadlines;
    use super::*;
    use crate::tensor::TensorError;

    fn verdict(e: TrainerError, elastic: bool) -> Verdict {
        Verdict::of(Err(e), elastic)
    }

    #[test]
    fn success_is_fine() {
        assert_eq!(Verdict::of(Ok(()), false), Verdict::Fine);
        assert_eq!(Verdict::of(Ok(()), true), Verdict::Fine);
    }

    #[test]
    fn a_node_failure_no_nodes_and_a_policy_error_end_the_run() {
        let failed = TrainerError::NodeFailed {
            node: 2,
            reason: "env crashed".into(),
        };
        assert_eq!(
            verdict(failed, false),
            Verdict::NodeFailed {
                node: 2,
                reason: "env crashed".into()
            }
        );
        for e in [
            TrainerError::NoNodes("no node for 5 s".into()),
            TrainerError::Policy("observation: 3 values, the policy takes 4".into()),
        ] {
            for elastic in [false, true] {
                assert_eq!(verdict(e.clone(), elastic), Verdict::RunFailed(e.clone()));
            }
        }
    }

    #[test]
    fn a_refused_join_closes_that_node_only() {
        let e = TrainerError::JoinRefused {
            node: 1,
            reason: "slot held".into(),
        };
        assert_eq!(verdict(e.clone(), true), Verdict::JoinRefused { node: 1, error: e });
    }

    #[test]
    fn a_lost_node_is_dropped_and_expected_only_in_an_elastic_run() {
        let lost = || TrainerError::NodeLost {
            node: 0,
            reason: "timed out".into(),
        };
        for elastic in [false, true] {
            assert_eq!(
                verdict(lost(), elastic),
                Verdict::NodeLost {
                    node: 0,
                    reason: "timed out".into(),
                    expected: elastic
                }
            );
        }
    }

    #[test]
    fn protocol_violations_close_the_offenders_connection() {
        for e in [
            TrainerError::UnexpectedBatch {
                node: 3,
                seq: 9,
                expected: "nothing".into(),
            },
            TrainerError::BadBatch {
                node: 3,
                reason: "5 frames, 10 asked".into(),
            },
            TrainerError::BadLayout {
                node: 3,
                reason: "another layout".into(),
            },
        ] {
            assert_eq!(
                verdict(e.clone(), false),
                Verdict::ProtocolViolation { node: 3, error: e }
            );
        }
    }

    #[test]
    fn other_errors_only_drop_the_message() {
        for e in [
            TrainerError::UnknownNode(7),
            TrainerError::Checkpoint("no checkpoint is being taken".into()),
            TrainerError::Tensor(TensorError::Invalid("shape".into())),
        ] {
            for elastic in [false, true] {
                assert_eq!(verdict(e.clone(), elastic), Verdict::Dropped(e.clone()));
            }
        }
    }

    #[test]
    fn a_run_that_is_not_elastic_does_not_expect_a_loss() {
        let m = machine(config(2, 1, 10, None, false));
        let lost = TrainerError::NodeLost {
            node: 1,
            reason: "timed out".into(),
        };
        assert!(matches!(
            m.verdict(Err(lost)),
            Verdict::NodeLost { expected: false, .. }
        ));
    }

    #[test]
    fn ticks_come_at_a_quarter_of_the_shortest_deadline_within_5_to_100_ms() {
        let m = || machine(config(2, 1, 10, None, false));
        assert_eq!(m().tick_every(), ms(100), "no deadline");
        let deadlines = |batch, shutdown| RequestDeadlines {
            batch: Some(ms(batch)),
            shutdown: Some(ms(shutdown)),
            ..RequestDeadlines::default()
        };
        assert_eq!(m().with_deadlines(deadlines(200, 1000)).tick_every(), ms(50));
        assert_eq!(m().with_deadlines(deadlines(4000, 1000)).tick_every(), ms(100));
        assert_eq!(m().with_deadlines(deadlines(8, 1000)).tick_every(), ms(5));
        let supervised = m()
            .with_deadlines(deadlines(4000, 1000))
            .with_supervision(supervision(1, Some(ms(120))));
        assert_eq!(supervised.tick_every(), ms(30), "supervision's continue_timeout counts");
    }
}
