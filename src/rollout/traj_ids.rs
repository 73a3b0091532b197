//! Trajectory ids: one lane per env of the whole run, so ids never collide.

use serde::{Deserialize, Serialize};

use super::RolloutError;

/// Allocates trajectory ids `lane, lane + lanes, lane + 2*lanes, ...`.
///
/// Each env in the whole run gets its own lane, so ids never collide across
/// envs or nodes without any coordination; `next` can be moved forward (after a
/// restart) so a new incarnation does not reuse ids either.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrajIds {
    pub(super) next: u64,
    pub(super) stride: u64,
}

impl TrajIds {
    /// The allocator of lane `lane` out of `lanes`.
    pub fn new(lane: u64, lanes: u64) -> Result<TrajIds, RolloutError> {
        if lanes == 0 || lane >= lanes {
            return Err(RolloutError::Config {
                field: "traj_lanes",
                reason: format!("lane {lane} is not in 0..{lanes}"),
            });
        }
        Ok(TrajIds {
            next: lane,
            stride: lanes,
        })
    }

    /// The next id to be handed out.
    pub fn peek(&self) -> u64 {
        self.next
    }

    /// The distance between two ids of this lane.
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// Hands out the next id.
    #[inline]
    pub fn alloc(&mut self) -> i64 {
        let id = self.next;
        self.next += self.stride;
        id as i64
    }

    /// Skips ahead so that no id below `min` is handed out again.
    pub fn skip_below(&mut self, min: u64) {
        while self.next < min {
            self.next += self.stride;
        }
    }
}
