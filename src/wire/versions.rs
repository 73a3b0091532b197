//! Which protocol versions can serve one run. Each version after the oldest a trainer
//! speaks added something a node must do (PROTOCOL.md, Changelog): a run that needs
//! it admits no version older than the one that brought it, and refuses such a node
//! at `hello`, before it is admitted, with a reason naming the versions.

use std::fmt;

use super::{OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION};

/// Something a run needs of its nodes that only a newer protocol version has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// `specs` in `ready` (version 4): the env is known only to the nodes, so the
    /// trainer learns its spaces from them.
    Specs {
        /// The env's name.
        env: String,
    },
    /// The recorded keys in every `batch` (version 5): the policy has a distribution,
    /// so its batches carry `action_log_prob` and the distribution's parameters.
    Recorded {
        /// The policy's kind (`mlp`, `random`, ...).
        policy: String,
    },
    /// The `onnx` policy in `welcome.spec` (version 5).
    Onnx,
    /// A recurrent `onnx` policy: `state` in its config, `is_init` and the state keys in
    /// every batch (version 6).
    Recurrent,
    /// An exploration module the node runs after the model (`exploration` in the
    /// `onnx` config: Ornstein–Uhlenbeck noise), with its state per env (version 7).
    Exploration,
    /// An `onnx` policy with the `qvalue` head (and its epsilon-greedy module): the
    /// batches carry `action_value` and `chosen_action_value` (version 8).
    QValue,
    /// A policy that records, in a run that asked for no recording (`record: false` in
    /// the node spec's policy: a deterministic run, by default): the batches leave the
    /// recorded keys out (version 9).
    Unrecorded {
        /// The policy's kind (`mlp`, `random`, ...).
        policy: String,
    },
    /// A multi-agent env (`agents` in its specs, declared to the trainer): batches of
    /// per-group entries with an agent axis (version 10).
    Agents,
    /// `prefetch`: the trainer sends a node its next `continue` while it collects the
    /// one before, and the node queues it (version 11).
    Prefetch,
    /// `done_on_any` in `welcome.spec.env`: a multi-agent env's episode ends once any
    /// agent is done (version 12; an older node would end it once every agent is).
    DoneOnAny,
    /// An exploration module (epsilon-greedy) in a multi-agent env's policy, run per
    /// agent (version 13; an older node refuses it when built).
    AgentExploration,
}

impl Need {
    /// The version that brought it: the oldest that can serve a run needing it.
    pub fn version(&self) -> u32 {
        match self {
            Need::Specs { .. } => 4,
            Need::Recorded { .. } | Need::Onnx => 5,
            Need::Recurrent => 6,
            Need::Exploration => 7,
            Need::QValue => 8,
            Need::Unrecorded { .. } => 9,
            Need::Agents => 10,
            Need::Prefetch => 11,
            Need::DoneOnAny => 12,
            Need::AgentExploration => 13,
        }
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Need::Specs { env } => write!(
                f,
                "its env {env} is known only to its nodes, which report its spaces in ready's specs (version 4)"
            ),
            Need::Recorded { policy } => write!(
                f,
                "its policy ({policy}) records action_log_prob and its distribution's parameters in every batch \
                 (version 5)"
            ),
            Need::Onnx => write!(f, "its policy is onnx, a model sent in welcome.spec (version 5)"),
            Need::Recurrent => write!(
                f,
                "its policy is a recurrent onnx model, whose state the node keeps per env and records with is_init \
                 in every batch (version 6)"
            ),
            Need::Exploration => write!(
                f,
                "its onnx policy has an exploration module (Ornstein-Uhlenbeck noise) the node runs with its noise \
                 state per env (version 7)"
            ),
            Need::QValue => write!(
                f,
                "its onnx policy has the qvalue head, which records action_value and chosen_action_value in every \
                 batch, and runs epsilon-greedy exploration (version 8)"
            ),
            Need::Unrecorded { policy } => write!(
                f,
                "its policy ({policy}) records nothing in this run (record off, as in a deterministic run): its \
                 batches leave out action_log_prob and the distribution's parameters (version 9)"
            ),
            Need::Agents => write!(
                f,
                "its env has several agents, whose batches hold each group's entries on an agent axis (version 10)"
            ),
            Need::Prefetch => write!(
                f,
                "it prefetches: a node is sent its next continue while it collects one, and queues it (version 11)"
            ),
            Need::DoneOnAny => write!(
                f,
                "its env's episodes end once any agent is done (done_on_any), where older nodes end them once every \
                 agent is (version 12)"
            ),
            Need::AgentExploration => write!(
                f,
                "its policy explores (epsilon-greedy) on an env of several agents, per agent (version 13)"
            ),
        }
    }
}

/// The protocol versions a trainer admits for one run: [`OLDEST_PROTOCOL_VERSION`] to
/// [`PROTOCOL_VERSION`], less those older than what the run needs. Computed once from
/// the run's plan, before any node joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmitVersions {
    /// The need that sets the oldest version admitted (the first of the highest).
    need: Option<Need>,
}

impl Default for AdmitVersions {
    fn default() -> AdmitVersions {
        AdmitVersions::all()
    }
}

impl AdmitVersions {
    /// Every version this trainer speaks: a run that needs nothing of the newer ones.
    pub fn all() -> AdmitVersions {
        AdmitVersions { need: None }
    }

    /// The versions that serve a run with these needs: from the highest version any
    /// of them needs (the first such need is the one a refusal names).
    pub fn serving(needs: impl IntoIterator<Item = Need>) -> AdmitVersions {
        let need = needs.into_iter().fold(None::<Need>, |best, n| match best {
            Some(b) if b.version() >= n.version() => Some(b),
            _ => Some(n),
        });
        AdmitVersions { need }
    }

    /// The oldest version admitted.
    pub fn oldest(&self) -> u32 {
        self.need
            .as_ref()
            .map_or(OLDEST_PROTOCOL_VERSION, |n| n.version().max(OLDEST_PROTOCOL_VERSION))
    }

    /// What sets [`Self::oldest`], if anything above [`OLDEST_PROTOCOL_VERSION`] does.
    pub fn need(&self) -> Option<&Need> {
        self.need.as_ref()
    }

    /// Whether a node speaking `version` can serve the run; if not, the `reject`
    /// reason, naming the versions this trainer speaks and this run admits.
    pub fn check(&self, version: u32) -> Result<(), String> {
        let speaks = span(OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION);
        let oldest = self.oldest();
        if !(OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
            let run = if oldest > OLDEST_PROTOCOL_VERSION {
                format!("; this run admits {}", span(oldest, PROTOCOL_VERSION))
            } else {
                String::new()
            };
            return Err(format!(
                "protocol version {version} is not supported (this trainer speaks {speaks}{run})"
            ));
        }
        match &self.need {
            Some(need) if version < oldest => Err(format!(
                "protocol version {version} cannot serve this run: {need}; this run admits {} (this trainer \
                 speaks {speaks}, the older ones for runs that need less)",
                span(oldest, PROTOCOL_VERSION)
            )),
            _ => Ok(()),
        }
    }
}

/// `3 to 9`, or `8` alone.
fn span(from: u32, to: u32) -> String {
    if from == to {
        format!("{from}")
    } else {
        format!("{from} to {to}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded() -> Need {
        Need::Recorded { policy: "mlp".into() }
    }

    fn specs() -> Need {
        Need::Specs { env: "Custom".into() }
    }

    #[test]
    fn a_multi_agent_env_declared_to_the_trainer_admits_version_10_and_up() {
        let v = AdmitVersions::serving([specs(), Need::Agents, recorded()]);
        assert_eq!(v.oldest(), 10);
        assert_eq!(v.need(), Some(&Need::Agents));
        assert_eq!(v.check(10), Ok(()));
        assert!(v
            .check(9)
            .is_err_and(|r| r.contains("its env has several agents") && r.contains("this run admits 10 to 13 (")));
    }

    #[test]
    fn a_prefetching_run_admits_version_11_only() {
        let v = AdmitVersions::serving([specs(), Need::Agents, recorded(), Need::Prefetch]);
        assert_eq!((v.oldest(), v.need()), (11, Some(&Need::Prefetch)));
        assert_eq!(v.check(11), Ok(()));
        assert!(v
            .check(10)
            .is_err_and(|r| r.contains("it prefetches") && r.contains("this run admits 11 to 13 (")));
    }

    #[test]
    fn a_run_needing_nothing_admits_every_version_the_trainer_speaks() {
        let all = AdmitVersions::all();
        assert_eq!(all.oldest(), OLDEST_PROTOCOL_VERSION);
        assert_eq!(AdmitVersions::serving([]), all);
        for v in OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION {
            assert_eq!(all.check(v), Ok(()), "version {v}");
        }
        assert_eq!(
            all.check(2),
            Err("protocol version 2 is not supported (this trainer speaks 3 to 13)".into())
        );
        assert_eq!(
            all.check(14),
            Err("protocol version 14 is not supported (this trainer speaks 3 to 13)".into())
        );
    }

    #[test]
    fn the_highest_need_sets_the_oldest_version_and_names_itself_in_the_refusal() {
        let v = AdmitVersions::serving([specs(), recorded(), Need::Onnx]);
        assert_eq!(v.oldest(), 5);
        assert_eq!(v.need(), Some(&recorded()), "the first of the highest");
        assert_eq!(v.check(5), Ok(()));
        assert_eq!(
            v.check(4),
            Err(
                "protocol version 4 cannot serve this run: its policy (mlp) records action_log_prob and its \
                 distribution's parameters in every batch (version 5); this run admits 5 to 13 (this trainer \
                 speaks 3 to 13, the older ones for runs that need less)"
                    .into()
            )
        );
        assert!(v
            .check(3)
            .is_err_and(|r| r.starts_with("protocol version 3 cannot serve this run")));
        assert_eq!(
            v.check(14),
            Err("protocol version 14 is not supported (this trainer speaks 3 to 13; this run admits 5 to 13)".into())
        );

        let v = AdmitVersions::serving([specs()]);
        assert_eq!(v.oldest(), 4);
        assert_eq!(v.check(4), Ok(()));
        assert_eq!(v.check(5), Ok(()));
        assert_eq!(v.check(6), Ok(()));
        assert_eq!(v.check(7), Ok(()));
        assert_eq!(
            v.check(3),
            Err(
                "protocol version 3 cannot serve this run: its env Custom is known only to its nodes, which \
                 report its spaces in ready's specs (version 4); this run admits 4 to 13 (this trainer speaks 3 \
                 to 13, the older ones for runs that need less)"
                    .into()
            )
        );
        let v = AdmitVersions::serving([Need::Onnx]);
        assert!(v.check(4).is_err_and(|r| r.contains("its policy is onnx")));
        // A recurrent policy: version 6 and up, whatever else the run needs.
        let v = AdmitVersions::serving([specs(), recorded(), Need::Onnx, Need::Recurrent]);
        assert_eq!((v.oldest(), v.need()), (6, Some(&Need::Recurrent)));
        assert_eq!(
            v.check(14),
            Err("protocol version 14 is not supported (this trainer speaks 3 to 13; this run admits 6 to 13)".into())
        );
        // An exploration module: version 7 and up.
        let v = AdmitVersions::serving([recorded(), Need::Onnx, Need::Recurrent, Need::Exploration]);
        assert_eq!((v.oldest(), v.need()), (7, Some(&Need::Exploration)));
        assert_eq!(
            v.check(14),
            Err("protocol version 14 is not supported (this trainer speaks 3 to 13; this run admits 7 to 13)".into())
        );
        // The qvalue head: version 8 alone; version 7 is refused naming the head.
        let v = AdmitVersions::serving([recorded(), Need::Onnx, Need::Exploration, Need::QValue]);
        assert_eq!((v.oldest(), v.need()), (8, Some(&Need::QValue)));
        assert_eq!(v.check(8), Ok(()));
        assert!(v
            .check(7)
            .is_err_and(|r| r.contains("the qvalue head") && r.contains("this run admits 8 to 13 (")));
        // A run that asked for no recording: version 9 alone.
        let v = AdmitVersions::serving([recorded(), Need::Unrecorded { policy: "mlp".into() }]);
        assert_eq!(v.oldest(), 9);
        assert!(v
            .check(8)
            .is_err_and(|r| r.contains("records nothing in this run") && r.contains("this run admits 9 to 13 (")));
    }
}
