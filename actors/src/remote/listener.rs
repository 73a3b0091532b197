//! The trainer's door: accepts connections, runs each handshake under a deadline,
//! admits authenticated nodes into free slots and rejects everyone else with a reason.
//! The decisions are the core's ([`TrainerHandshake`], [`Admission`]); this moves
//! their frames.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use rollout::connection::{Admission, HandshakeStep, TrainerHandshake};
use rollout::node_spec::NodeSpec;
use rollout::wire::{self, TrainerFrame, Welcome, NONCE_LEN, PREFIX_LEN};
use rollout::Weights;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::peer::PeerTiming;

/// What the listener needs to admit nodes.
#[derive(Clone)]
pub struct DoorConfig {
    /// The shared token.
    pub token: Vec<u8>,
    /// Heartbeat and frame limits, told to every node in `Welcome`.
    pub timing: PeerTiming,
    /// Deadline of one handshake.
    pub handshake_timeout: Duration,
}

/// A node that passed the handshake and was sent `Welcome`.
pub struct Joined {
    /// Its slot.
    pub index: usize,
    /// Its name.
    pub name: String,
    /// Where it connected from.
    pub peer: SocketAddr,
    /// The connection.
    pub stream: TcpStream,
}

/// Reads one frame body straight from a stream (no read-ahead, so the stream can
/// be handed on intact after the handshake).
pub async fn read_frame(s: &mut TcpStream, max: usize) -> Result<Vec<u8>, String> {
    let mut prefix = [0u8; PREFIX_LEN];
    s.read_exact(&mut prefix)
        .await
        .map_err(|e| format!("reading a frame: {e}"))?;
    let len = wire::body_len(prefix, max).map_err(|e| e.to_string())?;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)
        .await
        .map_err(|e| format!("frame cut short: {e}"))?;
    Ok(body)
}

async fn send(s: &mut TcpStream, f: &TrainerFrame, max: usize) -> Result<(), String> {
    let bytes = wire::encode(f, max).map_err(|e| e.to_string())?;
    s.write_all(&bytes).await.map_err(|e| format!("writing a frame: {e}"))
}

/// Each node's weights to welcome it with, by index: the trainer's version 0 (a node
/// that rejoins gets newer weights from the trainer right after, as an update).
pub type WelcomeWeights = Rc<Vec<Option<Arc<Weights>>>>;

/// Runs the accept loop for the life of the actix system. Every node admitted
/// comes out of the returned channel; `weights` gives each node the weights to
/// welcome it with.
pub fn open(
    listener: TcpListener,
    specs: Vec<NodeSpec>,
    cfg: DoorConfig,
    weights: WelcomeWeights,
) -> mpsc::UnboundedReceiver<Joined> {
    let admission = Rc::new(RefCell::new(Admission::new(specs.len())));
    open_with(listener, specs, cfg, weights, admission)
}

/// [`open`] over slots the caller keeps: releasing slot `i` (its node is gone and
/// being replaced) lets a node asking for index `i` in again.
pub fn open_with(
    listener: TcpListener,
    specs: Vec<NodeSpec>,
    cfg: DoorConfig,
    weights: WelcomeWeights,
    admission: Rc<RefCell<Admission>>,
) -> mpsc::UnboundedReceiver<Joined> {
    let (tx, rx) = mpsc::unbounded_channel();
    let specs = Rc::new(specs);
    actix_rt::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            };
            let (cfg, specs, admission, weights, tx) = (
                cfg.clone(),
                specs.clone(),
                admission.clone(),
                weights.clone(),
                tx.clone(),
            );
            actix_rt::spawn(async move {
                let deadline = cfg.handshake_timeout;
                match tokio::time::timeout(deadline, handshake(stream, peer, &cfg, &specs, &admission, &weights)).await
                {
                    Ok(Ok(joined)) => {
                        tracing::info!(node = joined.index, name = %joined.name, %peer, "node joined");
                        let _ = tx.send(joined);
                    }
                    Ok(Err(reason)) => tracing::warn!(%peer, %reason, "connection refused"),
                    Err(_) => {
                        tracing::warn!(%peer, "connection refused: handshake not done within {:.1} s", deadline.as_secs_f64())
                    }
                }
            });
        }
    });
    rx
}

async fn handshake(
    mut s: TcpStream,
    peer: SocketAddr,
    cfg: &DoorConfig,
    specs: &[NodeSpec],
    admission: &RefCell<Admission>,
    weights: &[Option<Arc<Weights>>],
) -> Result<Joined, String> {
    let _ = s.set_nodelay(true);
    let max = cfg.timing.max_frame;
    let nonce: Vec<u8> = (0..NONCE_LEN).map(|_| rand::random::<u8>()).collect();
    let mut hs = TrainerHandshake::new(&cfg.token, nonce);
    loop {
        let body = match read_frame(&mut s, max).await {
            Ok(b) => b,
            Err(reason) => {
                let _ = send(&mut s, &TrainerFrame::Reject { reason: reason.clone() }, max).await;
                return Err(reason);
            }
        };
        match hs.on_frame(&body) {
            HandshakeStep::Send(f) => send(&mut s, &f, max).await?,
            HandshakeStep::Reject(reason) => {
                let _ = send(&mut s, &TrainerFrame::Reject { reason: reason.clone() }, max).await;
                return Err(reason);
            }
            HandshakeStep::Authenticated { node_name, node_index } => {
                let admitted = admission.borrow_mut().admit(node_index);
                let index = match admitted {
                    Ok(i) => i,
                    Err(reason) => {
                        let _ = send(&mut s, &TrainerFrame::Reject { reason: reason.clone() }, max).await;
                        return Err(format!("{node_name}: {reason}"));
                    }
                };
                let welcome = Welcome {
                    node_index: index,
                    spec: specs[index].clone(),
                    weights: weights.get(index).cloned().flatten().map(Arc::unwrap_or_clone),
                    heartbeat_ms: cfg.timing.heartbeat.as_millis() as u64,
                    heartbeat_timeout_ms: cfg.timing.timeout.as_millis() as u64,
                    max_frame: max as u64,
                };
                if let Err(e) = send(&mut s, &TrainerFrame::Welcome(Box::new(welcome)), max).await {
                    admission.borrow_mut().release(index);
                    return Err(e);
                }
                return Ok(Joined {
                    index,
                    name: node_name,
                    peer,
                    stream: s,
                });
            }
        }
    }
}
