//! Launchers: where the nodes run. `Local` puts them on threads of this process,
//! `Process` in child processes, `Slurm` in the tasks of an `sbatch` job array.

pub mod local;
pub mod process;
pub mod remote;
pub mod slurm;

pub use slurm::SlurmOptions;

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
