//! Launchers: where the nodes run. `Local` puts them on threads of this process,
//! `Process` in child processes, `Slurm` in the tasks of an `sbatch` job array,
//! `External` leaves them to anyone who holds the token.
//!
//! [`Launcher`] is what a user configures; the crate-private `Launch` trait is how
//! each launcher starts, one type per launcher (`LocalLaunch`, `ProcessLaunch`,
//! `ExternalLaunch`, `SlurmLaunch`, all in `launchers`), so the collector starts every
//! one the same way: the launcher starts (or readies the door for) the nodes on the
//! caller's thread and hands back a `Launched`: a `TrainerStart`, run inside the
//! actix system, and the `NodeHandles` the collector keeps until shutdown.
//!
//! Layers, each file using only those below it: `launchers`; `launched` (the one
//! type of launched nodes); `over_tcp` (a trainer whose nodes join over TCP, and its
//! restarts) and `elastic`; `local` (a trainer over in-process nodes), `process`
//! (child processes), `slurm` (the job array, its queries and resubmissions), then
//! `slurm_avoid` (the host a resubmitted task avoids), `slurm_command` (one SLURM
//! command under a deadline), `node_command` (the command both start a node with),
//! `join_door`.

mod elastic;
mod join_door;
mod launched;
mod launchers;
pub mod local;
pub(crate) mod node_command;
pub(crate) mod over_tcp;
pub mod process;
pub(crate) mod slurm;
mod slurm_avoid;
mod slurm_command;

use rollout::machine::{ConfigError, TrainerMachine};
use rollout::node_spec::NodeSpec;
use rollout::Registry;

pub(crate) use join_door::JoinDoor;
pub(crate) use launched::{Launched, NodeHandles};
pub(crate) use launchers::{ExternalLaunch, LocalLaunch, ProcessLaunch, SlurmLaunch};
pub use slurm::SlurmOptions;

/// What [`CollectorBuilder::on_listening`](crate::CollectorBuilder::on_listening) calls.
pub type ListeningHook = std::sync::Arc<dyn Fn(std::net::SocketAddr) + Send + Sync>;

use crate::delivery::Delivery;
use crate::error::CollectError;

/// Where the nodes of a collector run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// Node actors in this process, each env worker on its own arbiter thread.
    #[default]
    Local,
    /// Child processes that join over loopback, each running the node command
    /// (`node_command`; default `rollout node` from this executable or `node_program`)
    /// with `--join ADDR --index i --name process-i`, the token in `ROLLOUT_TOKEN`.
    Process,
    /// Nodes started by anyone else (`rollout node --join`, a user binary calling
    /// `run_node`) join the trainer's `listen` address.
    External,
    /// ONE `sbatch` job array of `nodes` tasks, task `i` running the node command
    /// (`node_command`; default `rollout node` from this executable or `node_program`)
    /// with `--join ADVERTISE --index i --name ... --token-file PATH`.
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
