//! The `External` launcher: starts nothing; nodes started by anyone who holds the
//! token (`rollout node --join`, a user binary calling `run_node`) join the door.

use super::join_door::JoinDoor;
use super::launched::{Launched, NodeHandles, TrainerStart};
use super::{Launch, NodePlan};
use crate::error::CollectError;

/// Binds the door and waits for the nodes to come.
pub(crate) struct ExternalLaunch {
    /// Where the nodes join.
    pub(crate) door: JoinDoor,
}

impl Launch for ExternalLaunch {
    fn start(self: Box<Self>, plan: NodePlan) -> Result<Launched, CollectError> {
        let (listener, addr) = self.door.bind()?;
        Ok(Launched {
            trainer: TrainerStart::Joining {
                plan,
                listener,
                door: self.door,
            },
            nodes: NodeHandles {
                listen_addr: Some(addr),
                ..NodeHandles::default()
            },
        })
    }
}
