//! What a [`Launch`](super::Launch) hands back: how the trainer meets its nodes (run
//! inside the actix system) and the handles on the nodes the collector keeps.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::join_door::JoinDoor;
use super::local::{self, Started};
use super::over_tcp::{self, JoinWatch, ProcessWatch, Respawn};
use super::process::Children;
use super::slurm::{SlurmError, SlurmJob};
use super::NodePlan;
use crate::error::CollectError;

/// A started launch.
pub(crate) struct Launched {
    /// Starts the trainer over the nodes; runs inside an actix `System`.
    pub(crate) trainer: TrainerStart,
    /// What the collector keeps of the nodes until shutdown.
    pub(crate) nodes: NodeHandles,
}

/// How the trainer meets its nodes: it builds them itself, or waits for them to join.
pub(crate) enum TrainerStart {
    /// Nodes on this process's arbiters, built from their specs.
    Local(NodePlan),
    /// Nodes that join over TCP through `listener`.
    Joining {
        /// The run.
        plan: NodePlan,
        /// The bound socket.
        listener: TcpListener,
        /// The door's settings.
        door: JoinDoor,
    },
}

impl TrainerStart {
    /// How long the caller waits for [`Self::run`] before giving up: the join timeout
    /// and some when nodes join, else a minute.
    pub(crate) fn ready_wait(&self) -> Duration {
        match self {
            TrainerStart::Local(_) => Duration::from_secs(60),
            TrainerStart::Joining { door, .. } => door.join_timeout + Duration::from_secs(30),
        }
    }

    /// Starts the trainer; local nodes at once, joining ones once every one has joined
    /// (bounded by the join timeout). `watch` reads on the nodes' state while they join,
    /// `respawn` starts a failed node again (supervised runs); both apply to joining
    /// nodes only. Must run inside a running actix `System`.
    pub(crate) async fn run(
        self,
        watch: Option<Arc<dyn JoinWatch>>,
        respawn: Option<Respawn>,
    ) -> Result<Started, CollectError> {
        match self {
            TrainerStart::Local(p) => local::start(p),
            TrainerStart::Joining { plan, listener, door } => {
                over_tcp::start(plan, listener, door.door, door.join_timeout, watch, respawn).await
            }
        }
    }
}

/// The collector's hold on the nodes a launcher started: the address they join, the
/// node processes, the SLURM job. Each is released at shutdown.
#[derive(Default)]
pub(crate) struct NodeHandles {
    /// The address remote nodes join, when they do.
    pub(crate) listen_addr: Option<SocketAddr>,
    /// Node processes (`Process`); shared with the restarter that respawns them.
    pub(crate) children: Option<Arc<Mutex<Children>>>,
    /// The job array (`Slurm`).
    pub(crate) slurm_job: Option<SlurmJob>,
}

impl NodeHandles {
    /// Reads on the nodes while they join (the SLURM tasks' states, whether the node
    /// processes still run).
    pub(crate) fn watch(&self) -> Option<Arc<dyn JoinWatch>> {
        match (&self.children, &self.slurm_job) {
            (Some(c), _) => Some(Arc::new(ProcessWatch(Arc::clone(c))) as Arc<dyn JoinWatch>),
            (None, Some(j)) => Some(Arc::new(j.query()) as Arc<dyn JoinWatch>),
            _ => None,
        }
    }

    /// How a failed node is started again, when this launcher started it.
    pub(crate) fn respawn(&self) -> Option<Respawn> {
        match (&self.children, &self.slurm_job) {
            (Some(c), _) => Some(Respawn::Process(Arc::clone(c))),
            (None, Some(j)) => Some(Respawn::Slurm(j.resubmitter())),
            _ => None,
        }
    }

    /// Process ids of the node processes, by node index.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.children
            .as_ref()
            .and_then(|c| c.lock().ok().map(|c| c.pids()))
            .unwrap_or_default()
    }

    /// The node processes, owned, once nothing else shares them (no [`Self::respawn`]
    /// handed out), e.g. for an embedded run whose owner reaps them.
    pub(crate) fn into_children(self) -> Option<Children> {
        let shared = self.children?;
        let mutex = Arc::try_unwrap(shared).ok()?;
        Some(match mutex.into_inner() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        })
    }

    /// Reaps the node processes (each `grace` to exit by itself), then ends the SLURM job
    /// and checks that no task is left: its result, when there is a job.
    pub(crate) fn shutdown(&mut self, grace: Duration) -> Option<Result<(), SlurmError>> {
        if let Some(c) = self.children.take() {
            match c.lock() {
                Ok(mut c) => c.reap(grace),
                Err(poisoned) => poisoned.into_inner().reap(grace),
            }
        }
        self.slurm_job.take().map(|mut j| j.shutdown(grace))
    }
}
