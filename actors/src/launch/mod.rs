//! Launchers: where the nodes run. `Local` puts them on threads of this process.

pub mod local;
pub mod process;
pub mod remote;

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
}
