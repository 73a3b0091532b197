//! Where each node is, as one enum: idle, collecting, its batch arriving, released
//! while that batch travels, restarting, down. The trainer's handlers move a node
//! between these by the methods here, so no handler resets loose flags by hand and
//! no impossible combination (a down node with work in flight, a restarting node
//! with a batch on its way) can be written.
//!
//! | from | event | to | method |
//! |---|---|---|---|
//! | `Idle` | `Continue` sent | `Collecting` | [`NodeState::asked`] |
//! | `Collecting` | its batch's first bytes arrive | `Arriving` | [`NodeState::begin_arriving`] |
//! | `Collecting` | `prefetch`: the next `Continue` sent ahead | `Released`, not on its way | [`NodeState::asked`] |
//! | `Arriving` | early release: the next `Continue` sent | `Released` | [`NodeState::asked`] |
//! | `Released`, not on its way | its batch's first bytes arrive | `Released` | [`NodeState::begin_arriving`] |
//! | `Arriving` | the batch is whole | `Collecting` | [`NodeState::batch_whole`] |
//! | `Collecting` | the batch is accepted | `Idle` | [`NodeState::answered`] |
//! | `Released` | the batch is whole | `Released`, not on its way | [`NodeState::batch_whole`] |
//! | `Released` | the batch is accepted | `Collecting` the next, timed from now | [`NodeState::answered`] |
//! | up | failed, timed out, disconnected, said `leave` | `Down`, returning the newest `Continue`'s frames | [`NodeState::lose`] |
//! | `Down` | supervised, within the intensity | `Restarting`, holding those frames | [`NodeState::restart`] |
//! | `Restarting` | a `Continue` to send | `Restarting`, holding its frames | [`NodeState::hold`] |
//! | `Restarting` | the launcher brought it back | `Idle` (then the held frames under a new seq) | [`NodeState::back`] |
//! | `Restarting` | the restart failed, or shutdown | `Down` | |
//! | any | `Down` (the answer to `Shutdown`) | `Down` | |
//! | `Down` | a `Continue` to send | `Down` (nothing sent) | [`NodeState::hold`] |
//! | `Down` | elastic: a node joined the free slot | `Idle` (then weights, seed, `Continue`) | `TrainerMachine::node_joined` |
//!
//! In an elastic run a `Down` slot is free: no node holds it (none joined yet, or
//! its node left or was lost), and a node that joins takes it.

use std::time::Duration;

use crate::checkpoint::NodeBook;

/// A `Continue` the trainer sent and times: it counts as lost once unanswered for
/// longer than the `continue_timeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Asked {
    /// Its seq; the answer carries it back.
    pub(super) seq: u64,
    /// Frames asked for.
    pub(super) frames: usize,
    /// The weights version the node collects it with: the last weights the trainer
    /// sent the node before this `Continue` (a node applies updates between batches
    /// only, in the order they came), which its batch must name.
    pub(super) version: u64,
    /// When it started to count (machine clock).
    pub(super) since: Duration,
}

/// Where one node is; the transitions are in the module's table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum NodeState {
    /// Up, with nothing asked of it (between batches, or its batch waits to be yielded).
    #[default]
    Idle,
    /// Up, collecting the frames of `asked`.
    Collecting {
        /// The `Continue` it answers next.
        asked: Asked,
    },
    /// Up, and the batch answering `asked` began to arrive (a remote node's first
    /// bytes) but is not whole yet; the node was not released early.
    Arriving {
        /// The `Continue` the arriving batch answers.
        asked: Asked,
    },
    /// Two `Continue`s outstanding: the node was sent `next` before its batch
    /// answering `batch` was accepted, by early release (that batch is on its way, see
    /// `TrainerMachine::batch_arriving`) or by `prefetch` (sent ahead while `batch` is
    /// collected, queued at the node behind it). The node answers in order, `batch`
    /// first. `batch` is timed until it is accepted; `next` from then on.
    Released {
        /// The `Continue` answered first.
        batch: Asked,
        /// The `Continue` the node collects once `batch` is collected (timed once
        /// `batch` is accepted).
        next: Asked,
        /// Bytes of the batch answering `batch` arrived and it is not whole yet. False
        /// while that batch is collected (sent ahead), and once it came whole but was
        /// refused: the trainer still waits for an answer to `batch`, but nothing of
        /// this node is on its way.
        on_its_way: bool,
    },
    /// Failed and being restarted: no `Continue`, no pushes, until the launcher reports.
    Restarting {
        /// Frames of the `Continue` lost with the failed incarnation (or asked while
        /// it restarts), sent again under a new seq once it is back.
        held: Option<usize>,
    },
    /// Answered `Shutdown`, or lost for good: gets nothing any more. In an elastic
    /// run, a free slot: a node that joins takes it.
    Down,
}

impl NodeState {
    /// Up: neither restarting nor down.
    pub(super) fn is_up(&self) -> bool {
        !matches!(self, NodeState::Restarting { .. } | NodeState::Down)
    }

    /// Answered `Shutdown`, or lost for good.
    pub(super) fn is_down(&self) -> bool {
        matches!(self, NodeState::Down)
    }

    /// Being restarted.
    pub(super) fn is_restarting(&self) -> bool {
        matches!(self, NodeState::Restarting { .. })
    }

    /// Up with nothing asked of it.
    pub(super) fn is_idle(&self) -> bool {
        matches!(self, NodeState::Idle)
    }

    /// The newest `Continue` it has to answer, as (seq, frames): in early release,
    /// the one it collects while its previous batch travels.
    pub(super) fn outstanding(&self) -> Option<(u64, usize)> {
        match *self {
            NodeState::Collecting { asked } | NodeState::Arriving { asked } => Some((asked.seq, asked.frames)),
            NodeState::Released { next, .. } => Some((next.seq, next.frames)),
            _ => None,
        }
    }

    /// The newest `Continue` (`seq`) goes out only now, after the weights of `version`
    /// (one held until the node had weights): its batch is collected with them.
    pub(super) fn sent_with(&mut self, seq: u64, version: u64) {
        match self {
            NodeState::Collecting { asked } | NodeState::Arriving { asked } if asked.seq == seq => {
                asked.version = version;
            }
            NodeState::Released { next, .. } if next.seq == seq => next.version = version,
            _ => {}
        }
    }

    /// The `Continue` its next batch must answer (a node answers in order), which
    /// is also the one timed: in early release, the batch on its way.
    pub(super) fn expected(&self) -> Option<Asked> {
        match *self {
            NodeState::Collecting { asked } | NodeState::Arriving { asked } => Some(asked),
            NodeState::Released { batch, .. } => Some(batch),
            _ => None,
        }
    }

    /// Work is asked of it or held for it: once its waiting batch is yielded it
    /// must not be asked again.
    pub(super) fn has_work(&self) -> bool {
        match self {
            NodeState::Idle | NodeState::Down => false,
            NodeState::Restarting { held } => held.is_some(),
            _ => true,
        }
    }

    /// No batch of it is asked for and not yet whole: a checkpoint may ask its state.
    pub(super) fn nothing_in_flight(&self) -> bool {
        self.expected().is_none()
    }

    /// A batch of it began to arrive and is not whole yet (released or not).
    pub(super) fn in_transit(&self) -> bool {
        matches!(
            self,
            NodeState::Arriving { .. } | NodeState::Released { on_its_way: true, .. }
        )
    }

    /// Work for it that cannot be sent now: a restarting node holds the frames
    /// for its next incarnation, a down node drops them. Returns true when held
    /// or dropped, false when the node is up and the `Continue` is to be sent.
    pub(super) fn hold(&mut self, frames: usize) -> bool {
        match self {
            NodeState::Restarting { held } => {
                *held = Some(frames);
                true
            }
            NodeState::Down => true,
            _ => false,
        }
    }

    /// A `Continue` was sent to it (an up node), `asked.since` the time of sending.
    /// Sent while its batch arrives, it releases the node early: that batch is still
    /// expected first, and the new `Continue` is collected meanwhile. Sent while it
    /// collects (`prefetch`), the new one queues behind the one collected.
    pub(super) fn asked(&mut self, asked: Asked) {
        *self = match *self {
            NodeState::Collecting { asked: batch } => NodeState::Released {
                batch,
                next: asked,
                on_its_way: false,
            },
            NodeState::Arriving { asked: batch } => NodeState::Released {
                batch,
                next: asked,
                on_its_way: true,
            },
            NodeState::Released { batch, on_its_way, .. } => NodeState::Released {
                batch,
                next: asked,
                on_its_way,
            },
            _ => NodeState::Collecting { asked },
        };
    }

    /// Its batch's first bytes arrived. Returns the `Continue` it answers when that
    /// is the node's outstanding one (collecting, not released), else `None`: a node
    /// sent its next `Continue` ahead has that batch on its way now; anything else
    /// is unchanged.
    pub(super) fn begin_arriving(&mut self) -> Option<Asked> {
        match *self {
            NodeState::Collecting { asked } | NodeState::Arriving { asked } => {
                *self = NodeState::Arriving { asked };
                Some(asked)
            }
            NodeState::Released { ref mut on_its_way, .. } => {
                *on_its_way = true;
                None
            }
            _ => None,
        }
    }

    /// How many `Continue`s it has to answer: 0, 1, or 2 (the second sent ahead or
    /// released early).
    pub(super) fn asks(&self) -> usize {
        match self {
            NodeState::Collecting { .. } | NodeState::Arriving { .. } => 1,
            NodeState::Released { .. } => 2,
            _ => 0,
        }
    }

    /// Frames of the `Continue`s it has to answer (or will be asked again once back from
    /// a restart).
    pub(super) fn asked_frames(&self) -> u64 {
        match self {
            NodeState::Collecting { asked } | NodeState::Arriving { asked } => asked.frames as u64,
            NodeState::Released { batch, next, .. } => (batch.frames as u64).saturating_add(next.frames as u64),
            NodeState::Restarting { held } => held.unwrap_or(0) as u64,
            NodeState::Idle | NodeState::Down => 0,
        }
    }

    /// A batch of it came whole (accepted or not): nothing of it is on its way.
    pub(super) fn batch_whole(&mut self) {
        match self {
            NodeState::Arriving { asked } => *self = NodeState::Collecting { asked: *asked },
            NodeState::Released { on_its_way, .. } => *on_its_way = false,
            _ => {}
        }
    }

    /// Its batch answering [`Self::expected`] was accepted at `now`. Released, it
    /// goes on collecting `next`, timed from now; else it is idle.
    pub(super) fn answered(&mut self, now: Duration) {
        *self = match *self {
            NodeState::Released { next, .. } => NodeState::Collecting {
                asked: Asked { since: now, ..next },
            },
            _ => NodeState::Idle,
        };
    }

    /// It is gone (failed, lost, or down): returns the frames of the `Continue` it
    /// had outstanding, to be asked again. With two outstanding (released early, or
    /// sent ahead) only the newest's frames come back: the other batch is lost with
    /// the node, and async work is asked on demand, so the run asks for what it still
    /// needs anyway.
    pub(super) fn lose(&mut self) -> Option<usize> {
        let lost = self.outstanding().map(|(_, frames)| frames);
        *self = NodeState::Down;
        lost
    }

    /// It is being restarted, holding `held` frames for its next incarnation.
    pub(super) fn restart(&mut self, held: Option<usize>) {
        *self = NodeState::Restarting { held };
    }

    /// Its new incarnation is up: returns the frames it held. `None` (and nothing
    /// changes) when it was not restarting.
    pub(super) fn back(&mut self) -> Option<Option<usize>> {
        match *self {
            NodeState::Restarting { held } => {
                *self = NodeState::Idle;
                Some(held)
            }
            _ => None,
        }
    }
}

/// What the trainer keeps about one node: where it is, and its books.
#[derive(Clone, Debug, Default)]
pub(super) struct Node {
    /// Where it is.
    pub(super) state: NodeState,
    /// Weights pushed, batches since, trajectory-id offset (saved in a checkpoint).
    pub(super) book: NodeBook,
    /// Seqs below this were sent to an earlier incarnation: their batches are late.
    pub(super) incarnation_seq: u64,
    /// Requests sent and not answered yet, oldest first, timed by their deadlines.
    pub(super) awaiting: super::deadlines::AwaitedList,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// A `Continue` of `seq` and `frames` (collected with weights version `seq`), sent at `since`.
    fn ask(seq: u64, frames: usize, since: Duration) -> Asked {
        Asked {
            seq,
            frames,
            version: seq,
            since,
        }
    }

    fn collecting(seq: u64, frames: usize, since: Duration) -> NodeState {
        let mut s = NodeState::Idle;
        s.asked(ask(seq, frames, since));
        s
    }

    #[test]
    fn a_continue_sent_to_an_idle_node_makes_it_collect_and_is_timed_from_then() {
        let s = collecting(3, 8, t(5));
        assert_eq!(s, NodeState::Collecting { asked: ask(3, 8, t(5)) });
        assert_eq!(s.outstanding(), Some((3, 8)));
        assert_eq!(s.expected().map(|a| a.since), Some(t(5)));
        assert!(!s.in_transit());
        assert!(s.has_work());
    }

    #[test]
    fn early_release_answers_in_order_and_times_the_next_from_arrival() {
        let mut s = collecting(1, 8, t(0));
        assert_eq!(s.begin_arriving().map(|a| a.seq), Some(1));
        assert!(s.in_transit());
        s.asked(ask(2, 8, t(3)));
        assert!(s.in_transit());
        // The newest Continue is outstanding, the released one is expected first and timed.
        assert_eq!(s.outstanding(), Some((2, 8)));
        assert_eq!(s.expected().map(|a| a.seq), Some(1));
        assert_eq!(s.expected().map(|a| a.since), Some(t(0)));
        // A released node's next batch cannot begin to arrive before the first is whole.
        assert_eq!(s.begin_arriving(), None);
        s.batch_whole();
        assert!(!s.in_transit());
        s.answered(t(40));
        assert_eq!(
            s,
            NodeState::Collecting {
                asked: ask(2, 8, t(40))
            },
            "the next is collected with its own version, timed from the answer"
        );
    }

    #[test]
    fn a_continue_sent_ahead_queues_behind_the_one_collected_and_is_timed_once_that_is_answered() {
        let mut s = collecting(1, 8, t(0));
        s.asked(ask(2, 8, t(1)));
        assert_eq!(s.asks(), 2);
        assert!(!s.in_transit(), "nothing of it arrives yet");
        assert_eq!(
            s.expected(),
            Some(ask(1, 8, t(0))),
            "answered in order, timed from its own sending"
        );
        assert_eq!(s.outstanding(), Some((2, 8)));
        // Its first batch begins to arrive: on its way now, and no early release.
        assert_eq!(s.begin_arriving(), None);
        assert!(s.in_transit());
        s.batch_whole();
        s.answered(t(30));
        assert_eq!(s, collecting(2, 8, t(30)));
        assert_eq!(s.asks(), 1);
    }

    #[test]
    fn a_refused_released_batch_is_no_longer_on_its_way_but_still_expected() {
        let mut s = collecting(1, 8, t(0));
        s.begin_arriving();
        s.asked(ask(2, 8, t(3)));
        s.batch_whole();
        assert!(!s.in_transit());
        assert_eq!(s.expected().map(|a| a.seq), Some(1));
        assert_eq!(s.outstanding(), Some((2, 8)));
    }

    #[test]
    fn an_arriving_batch_that_comes_whole_leaves_the_node_collecting_until_accepted() {
        let mut s = collecting(4, 8, t(0));
        s.begin_arriving();
        s.batch_whole();
        assert_eq!(s, collecting(4, 8, t(0)));
        s.answered(t(1));
        assert_eq!(s, NodeState::Idle);
        assert!(!s.has_work());
    }

    #[test]
    fn losing_a_released_node_returns_its_newest_continue_and_leaves_it_down() {
        let mut s = collecting(1, 8, t(0));
        s.begin_arriving();
        s.asked(ask(2, 6, t(3)));
        assert_eq!(s.lose(), Some(6));
        assert_eq!(s, NodeState::Down);
        assert!(!s.in_transit() && s.outstanding().is_none() && s.expected().is_none());
    }

    #[test]
    fn a_restarting_node_holds_work_and_gets_it_back_when_up() {
        let mut s = NodeState::Idle;
        s.restart(None);
        assert!(!s.is_up() && s.is_restarting());
        assert!(!s.has_work());
        assert!(s.hold(8), "a restarting node holds work instead of being sent it");
        assert!(s.has_work());
        assert_eq!(s.back(), Some(Some(8)));
        assert_eq!(s, NodeState::Idle);
        assert_eq!(s.back(), None, "only a restarting node comes back");
    }

    #[test]
    fn a_down_node_drops_work_and_an_up_one_takes_it() {
        let mut s = NodeState::Down;
        assert!(s.hold(8));
        assert_eq!(s, NodeState::Down);
        let mut up = NodeState::Idle;
        assert!(!up.hold(8));
        assert_eq!(up, NodeState::Idle);
    }
}
