//! The node's side: join a trainer over TCP, build the node it is told to be,
//! serve until `Shutdown`. `rollout node --join` is this, and so is any user
//! binary that registers envs of its own and calls [`run_node`].

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use rollout::connection::{Inbound, NodeHandshake, NodeSession, NodeStep};
use rollout::message::{Batch, FromNode, ToNode};
use rollout::policy::Weights;
use rollout::pool::TensorPool;
use rollout::rollout::RolloutError;
use rollout::wire::{self, NodeFrame, TrainerFrame, Welcome, DEFAULT_MAX_FRAME};
use rollout::{Registry, TensorDict};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::frames::{FrameError, FrameStream, SharedPool};
use super::link::{spawn_writer, FrameSender};
use super::parts;
use super::timing::read_frame;
use crate::bounded_file::{read_bounded, shown, FileError, TOKEN_FILE};
use crate::messages::{Deliver, Recycle};
use crate::node::Node;
use crate::node_start::{build_workers_awaiting, start_node};

/// Why a node could not join or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// No token in `--token-file` or `ROLLOUT_TOKEN`.
    #[error("no token: pass --token-file PATH or set ROLLOUT_TOKEN")]
    NoToken,
    /// The token file could not be read: missing, not a regular file, or over
    /// [`TOKEN_FILE`]'s limit (64 KiB).
    #[error("the token file: {0}")]
    TokenFile(#[from] FileError),
    /// The token is too short to be a secret.
    #[error("the token is {len} bytes; at least {min} are required (e.g. `openssl rand -hex 16`)", min = wire::MIN_TOKEN_LEN)]
    ShortToken {
        /// Its length.
        len: usize,
    },
    /// The token file is readable by others than its owner (as ssh refuses such a key).
    #[error("the token file {path} is readable by group or others (mode {mode:03o}): `chmod 600 {path}`, or pass --allow-insecure-token-file")]
    InsecureTokenFile {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The trainer could not be reached.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The trainer refused this node.
    #[error("rejected by the trainer: {0}")]
    Rejected(String),
    /// The trainer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The env workers could not be built from the trainer's config.
    #[error("cannot build the node: {0}")]
    Build(#[from] RolloutError),
    /// The connection was lost before `Shutdown`.
    #[error("lost the trainer: {0}")]
    Lost(String),
}

/// How a node joins.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// A name for the trainer's logs.
    pub name: String,
    /// Ask for this node index (`None`: any free slot).
    pub index: Option<usize>,
    /// Give up connecting and handshaking after this long.
    pub connect_timeout: Duration,
    /// Where envs are built from: register your own envs here.
    pub registry: Registry,
    /// Leave the run cleanly on SIGTERM or SIGINT: send `leave`, return `Ok` (what
    /// `rollout node` does; off by default, so a library caller keeps its signals).
    pub leave_on_signals: bool,
    /// Leave the run cleanly when this handle is pulled (see [`LeaveHandle::leave`]).
    pub leave: Option<LeaveHandle>,
}

/// Tells a node served by [`run_node`] to leave the run (`leave`, then `Ok`), from
/// any thread; pulled before the node joined, it leaves as soon as it is in.
#[derive(Clone, Debug, Default)]
pub struct LeaveHandle(Arc<tokio::sync::Notify>);

impl LeaveHandle {
    /// A handle not pulled yet.
    pub fn new() -> LeaveHandle {
        LeaveHandle::default()
    }

    /// The node leaves.
    pub fn leave(&self) {
        self.0.notify_one();
    }
}

/// Resolves when the node is to leave: a pulled [`LeaveHandle`], or with
/// `signals`, SIGTERM or SIGINT. Never, when neither is set (or the signal handlers
/// cannot be installed, which is logged).
async fn leave_asked(handle: Option<LeaveHandle>, signals: bool) -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let pulled = async {
        match handle {
            Some(h) => h.0.notified().await,
            None => std::future::pending().await,
        }
    };
    let signalled = async {
        if !signals {
            return std::future::pending().await;
        }
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(mut term), Ok(mut int)) => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            },
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "cannot handle SIGTERM and SIGINT; the node will not leave cleanly on them");
                std::future::pending().await
            }
        }
    };
    tokio::select! {
        _ = pulled => "asked to",
        why = signalled => why,
    }
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            name: default_name(),
            index: None,
            connect_timeout: Duration::from_secs(30),
            registry: Registry::with_builtins(),
            leave_on_signals: false,
            leave: None,
        }
    }
}

fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}:{}", host.trim(), std::process::id())
}

/// The shared token: the file's content (trailing newline removed) or `ROLLOUT_TOKEN`.
/// Never a command-line argument: those show in `ps`. Refused when shorter than
/// [`MIN_TOKEN_LEN`](wire::MIN_TOKEN_LEN) bytes, and (the way ssh refuses a key file)
/// when the file is readable by group or others, unless `insecure_file_ok`.
pub fn read_token(token_file: Option<&Path>, insecure_file_ok: bool) -> Result<Vec<u8>, JoinError> {
    let token = match token_file {
        Some(p) => {
            let mode = file_mode(p).map_err(|source| FileError::Io { path: shown(p), source })?;
            if mode & 0o077 != 0 && !insecure_file_ok {
                return Err(JoinError::InsecureTokenFile {
                    path: p.display().to_string(),
                    mode,
                });
            }
            let raw = read_bounded(p, TOKEN_FILE)?;
            let end = raw.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
            raw[..end].to_vec()
        }
        None => std::env::var("ROLLOUT_TOKEN").unwrap_or_default().into_bytes(),
    };
    if token.is_empty() {
        return Err(JoinError::NoToken);
    }
    if token.len() < wire::MIN_TOKEN_LEN {
        return Err(JoinError::ShortToken { len: token.len() });
    }
    Ok(token)
}

/// A file's permission bits (those a token file must keep to its owner).
fn file_mode(p: &Path) -> io::Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    Ok(std::fs::metadata(p)?.permissions().mode() & 0o777)
}

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

async fn handshake(addr: &str, token: &[u8], opts: &NodeOptions) -> Result<(TcpStream, Welcome), JoinError> {
    let connect = |reason: String| JoinError::Connect {
        addr: addr.to_string(),
        reason,
    };
    // The trainer may not be listening yet (nodes are often started first, by a
    // scheduler): retry with backoff; the caller's deadline bounds the whole wait.
    let mut backoff = Duration::from_millis(20);
    let mut s = loop {
        match TcpStream::connect(addr).await {
            Ok(s) => break s,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::debug!(%addr, "trainer not listening yet, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(connect(e.to_string())),
        }
    };
    let _ = s.set_nodelay(true);
    let max = DEFAULT_MAX_FRAME;
    let send = |f: NodeFrame| wire::encode(&f, max).map_err(|e| JoinError::Protocol(e.to_string()));
    let mut hs = NodeHandshake::new(token, opts.name.clone(), opts.index);
    s.write_all(&send(hs.hello())?)
        .await
        .map_err(|e| connect(e.to_string()))?;
    loop {
        match hs.on_frame(read_trainer_frame(&mut s, max).await?) {
            NodeStep::Send(f) => s.write_all(&send(f)?).await.map_err(|e| connect(e.to_string()))?,
            NodeStep::Welcomed(w) => return Ok((s, *w)),
            NodeStep::Rejected(reason) => return Err(JoinError::Rejected(reason)),
            NodeStep::Violation(reason) => return Err(JoinError::Protocol(reason)),
        }
    }
}

async fn read_trainer_frame(s: &mut TcpStream, max: usize) -> Result<TrainerFrame, JoinError> {
    let body = read_frame(s, max).await.map_err(JoinError::Lost)?;
    wire::decode(&body).map_err(|e| JoinError::Protocol(e.to_string()))
}

async fn serve(addr: String, token: Vec<u8>, opts: NodeOptions) -> (Result<(), JoinError>, Vec<Arbiter>) {
    let (mut stream, welcome) = match tokio::time::timeout(opts.connect_timeout, handshake(&addr, &token, &opts)).await
    {
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

/// How long a node that said its last frame waits for the trainer to close.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// A second handle on `stream`'s socket (a duplicate of its descriptor), so that the
/// socket outlives the halves the link reads and writes through. `None` if the
/// descriptor cannot be duplicated.
fn second_handle(stream: &TcpStream) -> Option<TcpStream> {
    let std: std::net::TcpStream = socket2::SockRef::from(stream).try_clone().ok()?.into();
    std.set_nonblocking(true).ok()?;
    TcpStream::from_std(std).ok()
}

/// Closes the connection after the node's last frame (`down`, `leave`) so that the
/// frame arrives: the write side is shut (the trainer reads the frame, then the end,
/// and closes its side), and what the trainer sent meanwhile (a heartbeat) is read
/// and dropped until it closes, at most [`CLOSE_WAIT`]. A socket closed with unread
/// bytes in it is reset instead, and a reset throws away what was still queued to
/// send: the last frame itself, on a slow link.
async fn close_cleanly(mut s: TcpStream) {
    use tokio::io::AsyncReadExt;
    let _ = s.shutdown().await;
    let drain = async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, drain).await;
}

/// Sends `failed` with `reason` and closes the connection, bounded: a node that cannot
/// start says why before it goes, so the trainer handles it as any failed node.
async fn tell_failure(stream: &mut TcpStream, node: usize, reason: String, max: usize) {
    tracing::error!(node, %reason, "cannot start");
    let frame = NodeFrame::Message(FromNode::Failed { node, reason });
    let Ok(bytes) = wire::encode(&frame, max) else {
        return;
    };
    let send = async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), send).await;
}

/// The link died.
#[derive(Message)]
#[rtype(result = "()")]
struct Lost(String);

/// The node leaves the run (the reason, for the log): `leave`, then the link ends.
#[derive(Message)]
#[rtype(result = "()")]
struct LeaveRun(&'static str);

/// The node's connection to the trainer: frames in → node, node's messages → frames out.
struct TrainerLink {
    index: usize,
    node: Addr<Node>,
    out: FrameSender,
    max: usize,
    /// The protocol's state and rules for this connection.
    session: NodeSession,
    done: Option<oneshot::Sender<Result<(), JoinError>>>,
    stream: Option<FrameStream<TrainerFrame>>,
    /// Weight versions received here, oldest first, until nobody else holds them.
    retired: Retired,
    /// The pending heartbeat timer: moved on whenever the trainer's beat is answered.
    beat: Option<SpawnHandle>,
}

/// Weight versions a node received, oldest first, until nobody else holds them.
type Retired = Rc<RefCell<VecDeque<Arc<Weights>>>>;

/// Moves the storage of weight versions nobody holds any more into `pool`. A
/// version stays while the node or a worker uses it, so an update is read into
/// the one before the current one: double buffering, at the cost of keeping one
/// spare copy of the weights.
fn reclaim_weights(retired: &Retired, pool: &mut TensorPool) {
    let mut retired = retired.borrow_mut();
    let mut kept = VecDeque::with_capacity(retired.len());
    while let Some(w) = retired.pop_front() {
        match Arc::try_unwrap(w) {
            Ok(free) => pool.put_weights(free),
            Err(held) => kept.push_back(held),
        }
    }
    *retired = kept;
}

impl TrainerLink {
    fn finish(&mut self, ctx: &mut Context<Self>, r: Result<(), JoinError>) {
        if let Some(tx) = self.done.take() {
            if let Err(e) = &r {
                tracing::warn!(node = self.index, error = %e, "leaving");
            }
            let _ = tx.send(r);
        }
        ctx.stop();
    }

    fn send(&mut self, f: &NodeFrame, ctx: &mut Context<Self>) {
        match wire::encode(f, self.max) {
            Ok(b) => self.send_parts(vec![Bytes::from(b)], ctx),
            Err(e) => tracing::error!(node = self.index, error = %e, "cannot encode a frame"),
        }
    }

    /// Sends a batch without copying its tensors into a frame: the frame's parts are
    /// its MessagePack headers and the tensors' own memory. Once the writer has put
    /// the last part on the socket, the storage goes back to the worker.
    fn send_batch(&mut self, batch: Batch, ctx: &mut Context<Self>) {
        // A session message is its own frame (`NodeFrame::Message` encodes as the
        // message): encoded as it is.
        let msg = FromNode::Batch(batch);
        let FromNode::Batch(b) = &msg else {
            unreachable!("built as a batch")
        };
        let (keys, blobs) = parts::blobs(b.data.iter());
        let encoded = wire::encode_parts(&msg, self.max, &blobs);
        let FromNode::Batch(b) = msg else {
            unreachable!("built as a batch")
        };
        let outgoing = Arc::new(OutgoingBatch {
            data: b.data,
            node: self.index,
            back: self.node.clone().recipient(),
        });
        match encoded {
            Ok(encoded) => {
                let bytes = parts::to_bytes(encoded, &keys, &outgoing);
                self.send_parts(bytes, ctx);
            }
            Err(e) => {
                // The trainer waits for this batch: tell it the node cannot deliver it
                // (a batch over the maximum frame size), rather than leave it to time out.
                tracing::error!(node = self.index, error = %e, "cannot encode a batch");
                let reason = format!("cannot send its batch: {e}");
                self.send(
                    &NodeFrame::Message(FromNode::Failed {
                        node: self.index,
                        reason,
                    }),
                    ctx,
                );
            }
        }
    }

    /// Queues a frame's parts back to back: only this actor writes to `out`, so no
    /// other frame comes between them.
    fn send_parts(&mut self, parts: Vec<Bytes>, ctx: &mut Context<Self>) {
        for part in parts {
            if self.out.send(part).is_err() {
                return self.finish(ctx, Err(JoinError::Lost("writer gone".into())));
            }
        }
    }
}

/// A batch on its way out, shared by the frame parts that are its tensors; when the
/// last part is dropped (written, or the connection gone) its storage goes back to
/// the node, whose worker collects its next batch into it.
struct OutgoingBatch {
    data: TensorDict,
    node: usize,
    back: Recipient<Recycle>,
}

impl Drop for OutgoingBatch {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        self.back.do_send(Recycle {
            node: Some(self.node),
            data,
        });
    }
}

impl parts::TensorHolder for OutgoingBatch {
    fn tensor(&self, key: &str) -> Option<&rollout::Tensor> {
        self.data.get(key).ok()
    }
}

impl Actor for TrainerLink {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(s) = self.stream.take() {
            ctx.add_stream(s);
        }
        self.schedule_beat(ctx);
    }
}

impl TrainerLink {
    /// Sends a heartbeat now and moves the timer to the session's next beat.
    fn beat(&mut self, ctx: &mut Context<Self>) {
        self.send(&NodeFrame::Heartbeat, ctx);
        self.session.beat_sent(Instant::now());
        self.schedule_beat(ctx);
    }

    /// Sets the heartbeat timer to [`NodeSession::next_beat`], replacing any pending one.
    fn schedule_beat(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.beat.take() {
            ctx.cancel_future(h);
        }
        let wait = self.session.next_beat().saturating_duration_since(Instant::now());
        self.beat = Some(ctx.run_later(wait, |act, ctx| {
            act.beat = None;
            match act.session.on_tick(Instant::now()) {
                Ok(()) => act.beat(ctx),
                Err(reason) => act.finish(ctx, Err(JoinError::Lost(reason))),
            }
        }));
    }
}

impl StreamHandler<Result<TrainerFrame, FrameError>> for TrainerLink {
    fn handle(&mut self, item: Result<TrainerFrame, FrameError>, ctx: &mut Self::Context) {
        let frame = match item {
            Ok(f) => f,
            Err(FrameError::Decode(e)) => return self.finish(ctx, Err(JoinError::Protocol(e.to_string()))),
            Err(e) => return self.finish(ctx, Err(JoinError::Lost(e.to_string()))),
        };
        match self.session.on_frame(frame, Instant::now()) {
            Inbound::Deliver(m) => {
                if let ToNode::UpdateWeights(u) = &m {
                    self.retired.borrow_mut().push_back(Arc::clone(&u.weights));
                }
                self.node.do_send(Deliver(m));
            }
            Inbound::Answer => self.beat(ctx),
            Inbound::Nothing => {}
            Inbound::Close(reason) => self.finish(ctx, Err(JoinError::Protocol(reason))),
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        self.finish(ctx, Err(JoinError::Lost("the trainer closed the connection".into())));
    }
}

impl Handler<Deliver<FromNode>> for TrainerLink {
    type Result = ();

    fn handle(&mut self, msg: Deliver<FromNode>, ctx: &mut Self::Context) {
        let ends = NodeSession::ends(&msg.0);
        match msg.0 {
            FromNode::Batch(b) => self.send_batch(b, ctx),
            other => self.send(&NodeFrame::Message(other), ctx),
        }
        if ends {
            self.finish(ctx, Ok(()));
        }
    }
}

impl Handler<LeaveRun> for TrainerLink {
    type Result = ();

    fn handle(&mut self, msg: LeaveRun, ctx: &mut Self::Context) {
        tracing::info!(node = self.index, why = msg.0, "leaving the run");
        // Whatever the workers collect now is not sent: the trainer asks others for it.
        self.send(&NodeFrame::Message(FromNode::Leave { node: self.index }), ctx);
        self.finish(ctx, Ok(()));
    }
}

impl Handler<Lost> for TrainerLink {
    type Result = ();

    fn handle(&mut self, msg: Lost, ctx: &mut Self::Context) {
        self.finish(ctx, Err(JoinError::Lost(msg.0)));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ndarray::{ArrayD, IxDyn};
    use rollout::Tensor;

    use super::*;

    fn version(v: u64) -> Arc<Weights> {
        let mut tensors = BTreeMap::new();
        tensors.insert("w".to_string(), Tensor::F32(ArrayD::zeros(IxDyn(&[64]))));
        Arc::new(Weights { version: v, tensors })
    }

    #[test]
    fn only_versions_nobody_holds_are_reclaimed_and_the_rest_wait() {
        let retired: Retired = Rc::new(RefCell::new(VecDeque::new()));
        let (old, current) = (version(1), version(2));
        retired.borrow_mut().push_back(old);
        retired.borrow_mut().push_back(Arc::clone(&current)); // a worker still holds it
        let mut pool = TensorPool::new(usize::MAX);
        reclaim_weights(&retired, &mut pool);
        assert_eq!(pool.bytes(), 64 * 4, "version 1's storage is back");
        assert_eq!(retired.borrow().len(), 1);
        drop(current);
        reclaim_weights(&retired, &mut pool);
        assert_eq!(pool.bytes(), 2 * 64 * 4, "version 2's once its holder let go");
        assert!(retired.borrow().is_empty());
    }
}
