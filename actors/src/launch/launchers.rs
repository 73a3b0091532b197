//! The launchers: what each [`Launcher`](super::Launcher) starts on the caller's
//! thread, before the actix system runs (binding the door, spawning children,
//! `sbatch`), and the [`Launched`] it hands back.

use std::sync::{Arc, Mutex};

use super::join_door::JoinDoor;
use super::launched::{Launched, NodeHandles, TrainerStart};
use super::node_command::NodeCommand;
use super::process::Children;
use super::slurm::{advertise_addr, SlurmJob, SlurmOptions};
use super::{config_error, Launch, NodePlan};
use crate::error::CollectError;

/// The `Local` launcher: nothing to start before the actix system runs; the trainer
/// builds the nodes itself ([`start`]).
pub(crate) struct LocalLaunch;

impl Launch for LocalLaunch {
    fn start(self: Box<Self>, plan: NodePlan) -> Result<Launched, CollectError> {
        Ok(Launched {
            trainer: TrainerStart::Local(plan),
            nodes: NodeHandles::default(),
        })
    }
}

/// The `Process` launcher: binds the door, then starts one `COMMAND --join` per node.
pub(crate) struct ProcessLaunch {
    /// Where the children join.
    pub(crate) door: JoinDoor,
    /// What starts a node (`rollout node` by default).
    pub(crate) command: NodeCommand,
}

impl Launch for ProcessLaunch {
    fn start(self: Box<Self>, plan: NodePlan) -> Result<Launched, CollectError> {
        let (listener, addr) = self.door.bind()?;
        let children = Children::spawn(&self.command, addr, &self.door.door.token, plan.specs.len()).map_err(|e| {
            config_error(
                self.command.field(),
                format!("cannot start `{}`: {e}", self.command.shown()),
            )
        })?;
        Ok(Launched {
            trainer: TrainerStart::Joining {
                plan,
                listener,
                door: self.door,
            },
            nodes: NodeHandles {
                listen_addr: Some(addr),
                children: Some(Arc::new(Mutex::new(children))),
                slurm_job: None,
            },
        })
    }
}

/// The `Slurm` launcher: binds the door, then submits one job array whose tasks dial
/// `advertise` (the bound port filled in).
pub(crate) struct SlurmLaunch {
    /// Where the tasks join.
    pub(crate) door: JoinDoor,
    /// What each task runs, then `--join` (`rollout node` by default).
    pub(crate) command: NodeCommand,
    /// The job's `sbatch` options.
    pub(crate) options: SlurmOptions,
    /// The `HOST[:PORT]` the tasks dial, validated.
    pub(crate) advertise: String,
}

impl Launch for SlurmLaunch {
    fn start(self: Box<Self>, plan: NodePlan) -> Result<Launched, CollectError> {
        let (listener, addr) = self.door.bind()?;
        let advertise = advertise_addr(&self.advertise, addr);
        let job = SlurmJob::submit(
            &self.options,
            &self.command,
            &advertise,
            &self.door.door.token,
            plan.specs.len(),
        )
        .map_err(|e| CollectError::Launch(e.to_string()))?;
        Ok(Launched {
            trainer: TrainerStart::Joining {
                plan,
                listener,
                door: self.door,
            },
            nodes: NodeHandles {
                listen_addr: Some(addr),
                children: None,
                slurm_job: Some(job),
            },
        })
    }
}

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
