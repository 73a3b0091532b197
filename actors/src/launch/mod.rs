//! Launchers: where the nodes run. `Local` puts them on threads of this process,
//! `Process` in child processes, `Slurm` in the tasks of an `sbatch` job array,
//! `External` leaves them to anyone who holds the token.
//!
//! [`Launcher`] is what a user configures; the crate-private `Launch` trait is how
//! each launcher starts, one type per launcher (`LocalLaunch`, `ProcessLaunch`,
//! `ExternalLaunch`, `SlurmLaunch`), so the collector starts every one the same way:
//! the launcher starts (or readies the door for) the nodes on the caller's thread and
//! hands back a `TrainerStart`, run inside the actix system, and the `NodeHandles`
//! the collector keeps until shutdown. `node_start` is the one way a node is
//! started, here and by a node that joined over TCP.

mod elastic;
mod external;
mod join_door;
mod launched;
pub mod local;
pub(crate) mod node_start;
pub mod process;
pub mod remote;
pub mod slurm;
mod slurm_avoid;

use rollout::machine::{ConfigError, TrainerMachine};
use rollout::node_spec::NodeSpec;
use rollout::Registry;

pub(crate) use external::ExternalLaunch;
pub(crate) use join_door::JoinDoor;
pub(crate) use launched::{Launched, NodeHandles};
pub use slurm::SlurmOptions;

use crate::delivery::Delivery;
use crate::error::CollectError;

/// Where the nodes of a collector run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// Node actors in this process, each env worker on its own arbiter thread.
    #[default]
    Local,
    /// Child processes of the `rollout` binary (see `node_program`) that join over loopback.
    Process,
    /// Nodes started by anyone else (`rollout node --join`, a user binary calling
    /// `run_node`) join the trainer's `listen` address.
    External,
    /// ONE `sbatch` job array of `nodes` tasks, task `i` running `rollout node --join
    /// ADVERTISE --index i` (the binary is `node_program`, default this executable).
    /// Needs the builder's `advertise` (the address the tasks dial) and a `listen`
    /// address they can reach. See [`SlurmOptions`] for the defaults.
    Slurm(SlurmOptions),
}

/// What every launcher starts from: a validated run, before anything is started.
pub(crate) struct NodePlan {
    /// The trainer's machine, configured (supervision, resume) but not started.
    pub(crate) machine: TrainerMachine,
    /// One spec per node, by index.
    pub(crate) specs: Vec<NodeSpec>,
    /// Where local nodes build their envs from.
    pub(crate) registry: Registry,
    /// The run's seed, sent to the nodes before the first batch.
    pub(crate) seed: u64,
    /// What each yielded batch goes through before its consumer sees it.
    pub(crate) delivery: Delivery,
}

/// How one launcher starts its nodes. Called on the caller's thread, outside any actix
/// system: what blocks (binding, spawning, `sbatch`) happens here, so its errors reach
/// the caller before a thread is started; what needs actix is in the returned
/// `TrainerStart`.
pub(crate) trait Launch: Send {
    /// Starts the nodes of `plan` (or readies the door they join by).
    fn start(self: Box<Self>, plan: NodePlan) -> Result<Launched, CollectError>;
}

/// A config error naming the builder setting at fault.
pub(crate) fn config_error(field: &'static str, reason: impl Into<String>) -> CollectError {
    CollectError::Config(ConfigError {
        field,
        reason: reason.into(),
    })
}
