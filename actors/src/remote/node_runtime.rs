//! The node's runtime: join a trainer over TCP, build the node it is told to be,
//! serve until `Shutdown`. `rollout node --join` is this, and so is any user
//! binary that registers envs of its own and calls [`run_node`].
//!
//! Over TLS when [`NodeOptions::tls`] is set (the trainer's certificate checked
//! before the login starts), plain TCP otherwise.
//!
//! This file is the node's life from the login to the last frame ([`run_node`]);
//! its parts: `options` (how a node joins), `token` (the shared secret), `login`
//! (connecting and the handshake), `trainer_link` (the session: frames in and out,
//! heartbeats, leaving), `leave` (asking a node to leave), `closing` (a clean
//! close, a failure told) and `error` ([`JoinError`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use rollout::connection::NodeSession;
use rollout::pool::TensorPool;
use rollout::wire::{self, TrainerFrame};
use tokio::sync::oneshot;

use super::frames::{FrameStream, SharedPool};
use super::link::spawn_writer;
use crate::node_start::{build_workers_awaiting, start_node};

mod closing;
mod error;
mod leave;
mod login;
mod options;
mod token;
mod trainer_link;

use closing::{close_cleanly, second_handle, tell_failure};
pub use error::JoinError;
use leave::leave_asked;
pub use leave::LeaveHandle;
use login::{handshake, Secure};
pub use options::NodeOptions;
pub use token::read_token;
use trainer_link::{reclaim_weights, LeaveRun, Lost, Retired, TrainerLink};

/// Joins the trainer at `addr` and serves until it says `Shutdown`; blocking.
/// Starts an actix system of its own and joins every thread it started.
pub fn run_node(addr: &str, token: &[u8], opts: NodeOptions) -> Result<(), JoinError> {
    let sys = System::new();
    let (result, arbiters) = sys.block_on(serve(addr.to_string(), token.to_vec(), opts));
    for a in &arbiters {
        a.stop();
    }
    for a in arbiters {
        let _ = a.join();
    }
    result
}

/// The node's TLS connector and the trainer's expected name, from `opts.tls`, every
/// file read and checked (`None`: plain TCP).
fn secure(addr: &str, opts: &NodeOptions) -> Result<Secure, JoinError> {
    let Some(tls) = &opts.tls else { return Ok(None) };
    Ok(Some((tls.connector()?, tls.server_name(addr)?)))
}

/// The node's life: logs in within `connect_timeout`, builds its workers from the
/// welcome, says `ready`, serves through a [`TrainerLink`] until it ends, then joins
/// the workers and closes cleanly. Returns the outcome and the arbiters to join.
async fn serve(addr: String, token: Vec<u8>, opts: NodeOptions) -> (Result<(), JoinError>, Vec<Arbiter>) {
    // TLS files are read and checked before the node dials.
    let secure = match secure(&addr, &opts) {
        Ok(s) => s,
        Err(e) => return (Err(e), Vec::new()),
    };
    let (mut stream, welcome) =
        match tokio::time::timeout(opts.connect_timeout, handshake(&addr, &token, &opts, &secure)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return (Err(e), Vec::new()),
            Err(_) => {
                return (
                    Err(JoinError::Connect {
                        addr,
                        reason: format!(
                            "not connected and welcomed within {:.1} s",
                            opts.connect_timeout.as_secs_f64()
                        ),
                    }),
                    Vec::new(),
                )
            }
        };
    let index = welcome.node_index;
    tracing::info!(node = index, trainer = %addr, "joined");
    let max = (welcome.max_frame as usize).max(1);
    // The workers act with the trainer's weights (`welcome.weights`), never with
    // weights of their own: unusable ones fail the node, and the trainer is told why.
    // Missing ones (a trainer that builds them from the specs this node reports) are
    // waited for: an `update_weights` comes before the first `continue`.
    let (rollouts, awaiting) = match build_workers_awaiting(&welcome.spec, &opts.registry, welcome.weights.as_ref()) {
        Ok(r) => r,
        Err(e) => {
            let reason = format!("cannot build the node from the trainer's welcome: {e}");
            tell_failure(&mut stream, index, reason, max).await;
            return (Err(e.into()), Vec::new());
        }
    };
    let mut session = NodeSession::new(&welcome, Instant::now());
    // Ready: the first frame after the handshake, before any answer to the trainer.
    let ready = session.ready(
        rollouts.first().map(|r| r.batch_layout()).unwrap_or_default(),
        rollouts.first().map(|r| r.env_specs()),
    );
    let ready = match wire::encode(&ready, max) {
        Ok(b) => Bytes::from(b),
        Err(e) => {
            return (
                Err(JoinError::Protocol(format!("cannot encode Ready: {e}"))),
                Vec::new(),
            )
        }
    };
    // A second handle on the socket, to close it cleanly once the link is done (see
    // `close_cleanly`); without one the node goes on as before.
    let closer = second_handle(&stream);
    let (read, write) = stream.into_split();
    let (done_tx, done_rx) = oneshot::channel();
    let link_ctx = Context::<TrainerLink>::new();
    let link = link_ctx.address();
    let fail = link.clone();
    let (out, writer) = spawn_writer(write, move |reason| fail.do_send(Lost(reason)));
    if out.send(ready).is_err() {
        return (Err(JoinError::Lost("writer gone before Ready".into())), Vec::new());
    }
    // A restarted worker starts from the weights the others started from.
    let weights = welcome.weights.clone().map(Arc::new);
    let started = start_node(
        &welcome.spec,
        &opts.registry,
        rollouts,
        weights,
        awaiting,
        link.clone().recipient(),
    );
    // Weight updates are read into the tensors of versions no worker holds any
    // more, reclaimed as each frame starts to arrive (double buffering).
    let pool: SharedPool = Rc::new(RefCell::new(TensorPool::new(max)));
    let retired: Retired = Rc::new(RefCell::new(VecDeque::new()));
    let reclaim = Rc::clone(&retired);
    let frames = FrameStream::<TrainerFrame>::new(read, max, Rc::clone(&pool))
        .on_frame(Box::new(move |pool| reclaim_weights(&reclaim, pool)));
    // The trainer's silence counts from the moment the link starts listening.
    session.heard(Instant::now());
    link_ctx.run(TrainerLink {
        index,
        node: started.addr.clone(),
        out,
        max,
        session,
        done: Some(done_tx),
        stream: Some(frames),
        retired,
        beat: None,
    });
    // Leaving is asked from outside (a signal, a handle): the link says `leave` and ends.
    let leave = leave_asked(opts.leave.clone(), opts.leave_on_signals);
    let leaving = link.clone();
    let leave_task = actix_rt::spawn(async move {
        let why = leave.await;
        leaving.do_send(LeaveRun(why));
    });
    let result = done_rx
        .await
        .unwrap_or_else(|_| Err(JoinError::Lost("the link stopped".into())));
    // Down said, left or lost: a batch still in flight is nobody's, and the workers'
    // threads are joined next.
    started.stop_workers();
    // The link has stopped and dropped its sender: let the writer flush what is
    // queued (Down must reach the trainer), bounded.
    leave_task.abort();
    drop(link);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    if result.is_ok() {
        if let Some(s) = closer {
            close_cleanly(s).await;
        }
    }
    (result, started.arbiters)
}
