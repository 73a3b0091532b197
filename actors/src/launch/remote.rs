//! Starts a trainer whose nodes join over TCP (`Process` and `External` launchers).

use std::cell::RefCell;
use std::rc::Rc;
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
    while joined.len() < n {
        match tokio::time::timeout_at(deadline, joined_rx.recv()).await {
            Ok(Some(j)) => joined.push(j),
            Ok(None) => return Err(CollectError::Join("the listener stopped".into())),
            Err(_) => {
                let have: Vec<usize> = joined.iter().map(|j| j.index).collect();
                let missing: Vec<usize> = (0..n).filter(|i| !have.contains(i)).collect();
                return Err(CollectError::Join(format!(
                    "{} of {n} nodes joined within {:.1} s; missing node indices {missing:?}",
                    joined.len(),
                    join_timeout.as_secs_f64()
                )));
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
