//! [`Embedded`]: a run started inside the caller's actix `System` (a learner actor of
//! theirs subscribes to it), for every launcher the caller can own.

use std::net::SocketAddr;
use std::time::Duration;

use actix::prelude::*;

use super::plan::Plan;
use crate::error::CollectError;
use crate::launch::process::Children;
use crate::launch::{config_error, Launched, Launcher};
use crate::trainer::Trainer;

/// What [`CollectorBuilder::start_embedded`](crate::CollectorBuilder::start_embedded) started inside the caller's actix `System`.
pub struct Embedded {
    /// The trainer.
    pub trainer: Addr<Trainer>,
    /// One arbiter per local env worker (none for remote nodes); the owner stops and joins them.
    pub arbiters: Vec<Arbiter>,
    /// Node processes of the `Process` launcher; the owner reaps them after the nodes are stopped.
    pub children: Option<Children>,
    /// The address remote nodes joined, when they did.
    pub listen_addr: Option<SocketAddr>,
    /// The metrics endpoint, when [`CollectorBuilder::metrics`](crate::CollectorBuilder::metrics)
    /// asked for one: it serves until dropped.
    pub metrics: Option<crate::metrics::MetricsServer>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("arbiters", &self.arbiters.len())
            .field("children", &self.children)
            .field("listen_addr", &self.listen_addr)
            .finish()
    }
}

/// Starts `plan` inside the caller's actix `System` (see
/// [`CollectorBuilder::start_embedded`](crate::CollectorBuilder::start_embedded)).
pub(super) async fn start(plan: Plan) -> Result<Embedded, CollectError> {
    if matches!(plan.launcher, Launcher::Slurm(_)) {
        return Err(config_error(
            "launcher",
            "start_embedded() runs Local, Process and External nodes; use build() for Slurm",
        ));
    }
    let Launched { trainer, nodes } = plan.launch.start(plan.nodes)?;
    let listen_addr = nodes.listen_addr;
    let mut children = nodes.into_children();
    match trainer.run(None, None).await {
        Ok(started) => Ok(Embedded {
            trainer: started.trainer,
            arbiters: started.arbiters,
            children,
            listen_addr,
            metrics: None,
        }),
        Err(e) => {
            if let Some(c) = children.as_mut() {
                c.reap(Duration::from_secs(1));
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use actix::System;

    use crate::error::CollectError;
    use crate::launch::{Launcher, SlurmOptions};
    use crate::CollectorBuilder;

    #[test]
    fn an_embedded_slurm_run_is_refused_naming_the_launcher() {
        let builder = CollectorBuilder::default()
            .env("CartPole-v1")
            .frames_per_batch(10)
            .launcher(Launcher::Slurm(SlurmOptions::default()))
            .advertise("127.0.0.1");
        match System::new().block_on(builder.start_embedded()) {
            Err(CollectError::Config(e)) => assert_eq!(e.field, "launcher"),
            Err(other) => panic!("expected a config error naming `launcher`, got {other}"),
            Ok(_) => panic!("an embedded Slurm run started"),
        }
    }
}
