//! Starts a trainer whose nodes join over TCP (`Process` and `External` launchers).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rollout::machine::TrainerMachine;
use rollout::node_spec::NodeSpec;
use tokio::net::TcpListener;
use tokio_util::codec::FramedRead;

use super::local::Started;
use crate::error::CollectError;
use crate::remote::codec::FrameCodec;
use crate::remote::link::spawn_writer;
use crate::remote::listener::{self, DoorConfig, Joined};
use crate::remote::peer::{Disconnect, RemoteNode, WeightsCache};
use crate::trainer::Trainer;

/// Watches the nodes a launcher started while the trainer waits for them to join
/// (the `Slurm` launcher reads its tasks' states). Both calls may block (they run on a
/// blocking thread) and must be bounded.
pub trait JoinWatch: Send + Sync {
    /// Called about once a second with the node indices not joined yet: `Some(reason)`
    /// when some of them never will (ends the wait at once with that reason).
    fn hopeless(&self, missing: &[usize]) -> Option<String>;
    /// Called at the join deadline: what is known of the missing nodes, for the error.
    fn describe(&self, missing: &[usize]) -> String;
}

impl JoinWatch for super::slurm::SlurmQuery {
    fn hopeless(&self, missing: &[usize]) -> Option<String> {
        super::slurm::SlurmQuery::hopeless(self, missing)
    }
    fn describe(&self, missing: &[usize]) -> String {
        super::slurm::SlurmQuery::describe(self, missing)
    }
}

/// Waits (bounded) for every node to join, then starts the trainer over them.
/// Must run inside a running actix `System`.
pub async fn start(
    machine: TrainerMachine,
    specs: Vec<NodeSpec>,
    listener: std::net::TcpListener,
    door: DoorConfig,
    join_timeout: Duration,
    seed: u64,
) -> Result<Started, CollectError> {
    start_watched(machine, specs, listener, door, join_timeout, seed, None).await
}

/// [`start`], with a [`JoinWatch`] on the nodes while they join.
pub async fn start_watched(
    machine: TrainerMachine,
    specs: Vec<NodeSpec>,
    listener: std::net::TcpListener,
    door: DoorConfig,
    join_timeout: Duration,
    seed: u64,
    watch: Option<Arc<dyn JoinWatch>>,
) -> Result<Started, CollectError> {
    let n = specs.len();
    listener
        .set_nonblocking(true)
        .map_err(|e| CollectError::Join(format!("cannot use the listening socket: {e}")))?;
    let listener = TcpListener::from_std(listener)
        .map_err(|e| CollectError::Join(format!("cannot use the listening socket: {e}")))?;
    let timing = door.timing;
    let mut joined_rx = listener::open(listener, specs, door, Rc::new(RefCell::new(None)));
    let mut joined: Vec<Joined> = Vec::with_capacity(n);
    let deadline = tokio::time::Instant::now() + join_timeout;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let missing =
        |joined: &[Joined]| -> Vec<usize> { (0..n).filter(|i| !joined.iter().any(|j| j.index == *i)).collect() };
    while joined.len() < n {
        tokio::select! {
            r = tokio::time::timeout_at(deadline, joined_rx.recv()) => match r {
                Ok(Some(j)) => joined.push(j),
                Ok(None) => return Err(CollectError::Join("the listener stopped".into())),
                Err(_) => {
                    let missing = missing(&joined);
                    let mut msg = format!(
                        "{} of {n} nodes joined within {:.1} s; missing node indices {missing:?}",
                        joined.len(),
                        join_timeout.as_secs_f64()
                    );
                    if let Some(w) = watch.clone() {
                        let m = missing.clone();
                        if let Ok(detail) = tokio::task::spawn_blocking(move || w.describe(&m)).await {
                            msg = format!("{msg}; {detail}");
                        }
                    }
                    return Err(CollectError::Join(msg));
                }
            },
            _ = tick.tick(), if watch.is_some() => {
                let missing = missing(&joined);
                let w = watch.clone().expect("checked");
                let m = missing.clone();
                if let Ok(Some(reason)) = tokio::task::spawn_blocking(move || w.hopeless(&m)).await {
                    return Err(CollectError::Join(format!(
                        "{} of {n} nodes joined; missing node indices {missing:?}: {reason}",
                        joined.len()
                    )));
                }
            }
        }
    }
    joined.sort_by_key(|j| j.index);
    let trainer_ctx = Context::<Trainer>::new();
    let trainer = trainer_ctx.address();
    let cache = WeightsCache::default();
    let mut nodes = Vec::with_capacity(n);
    let mut closers = Vec::with_capacity(n);
    for j in joined {
        let (read, write) = j.stream.into_split();
        let to_trainer = trainer.clone().recipient();
        let cache = cache.clone();
        let peer = RemoteNode::create(move |ctx| {
            let me = ctx.address();
            let (out, _writer) = spawn_writer(write, move |reason| me.do_send(Disconnect(reason)));
            ctx.add_stream(FramedRead::new(read, FrameCodec::new(timing.max_frame)));
            RemoteNode::new(j.index, j.name, out, to_trainer, cache, timing)
        });
        closers.push(Some(peer.clone().recipient()));
        nodes.push(peer.recipient());
    }
    trainer_ctx.run(
        Trainer::new(machine, nodes)
            .with_closers(closers)
            .with_initial_seed(seed),
    );
    Ok(Started {
        trainer,
        arbiters: Vec::new(),
    })
}
