//! Launchers: where the nodes run. `Local` puts them on threads of this process.

pub mod local;

/// Where the nodes of a collector run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// Node actors in this process, each env worker on its own arbiter thread.
    #[default]
    Local,
}
