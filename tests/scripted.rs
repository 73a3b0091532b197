//! A trainer played by hand over one connection, for tests of what a real Rust node
//! (`run_node` on a thread) sends and when.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rollout::connection::{HandshakeStep, TrainerHandshake};
use rollout::message::FromNode;
use rollout::node_spec::NodeSpec;
use rollout::wire::{self, NodeFrame, TrainerFrame, Welcome, DEFAULT_MAX_FRAME, NONCE_LEN};
use rollout::Weights;
use rollout_actors::remote::{run_node, NodeOptions};

use crate::wait::wait_until;

/// The token the scripted trainer and its node share.
const SCRIPTED_TOKEN: &[u8] = b"scripted-trainer-token";

/// How long any read of the scripted trainer, or the node's end, may take.
pub const SCRIPTED_DEADLINE: Duration = Duration::from_secs(60);

/// A trainer played by hand over one connection.
pub struct Scripted {
    /// The connection to the node.
    pub s: TcpStream,
}

impl Scripted {
    /// Sends `f` to the node.
    pub fn send(&mut self, f: &TrainerFrame) {
        let bytes = wire::encode(f, DEFAULT_MAX_FRAME).expect("encode");
        self.s.write_all(&bytes).expect("write");
    }

    /// The node's next frame, heartbeats included; `None` once it closed (or the
    /// read timed out).
    pub fn frame(&mut self) -> Option<NodeFrame> {
        let mut prefix = [0u8; 4];
        self.s.read_exact(&mut prefix).ok()?;
        let mut body = vec![0u8; u32::from_be_bytes(prefix) as usize];
        self.s.read_exact(&mut body).ok()?;
        Some(wire::decode::<NodeFrame>(&body).expect("the node sends valid frames"))
    }

    /// The node's next frame other than a heartbeat; `None` once it closed.
    pub fn recv(&mut self) -> Option<NodeFrame> {
        loop {
            match self.frame()? {
                NodeFrame::Heartbeat => continue,
                f => return Some(f),
            }
        }
    }

    /// The node's next session message; panics if it closes first.
    pub fn message(&mut self, what: &str) -> FromNode {
        match self.recv() {
            Some(NodeFrame::Message(m)) => m,
            other => panic!("expected {what}, got {other:?}"),
        }
    }
}

/// Listens, lets a Rust node join (`run_node` on a thread), runs the handshake and
/// welcomes it with `spec`, `weights` and heartbeats every `heartbeat_ms`.
pub fn scripted_join(
    spec: NodeSpec,
    weights: Option<Weights>,
    heartbeat_ms: u64,
) -> (Scripted, JoinHandle<Result<(), String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let node = thread::spawn(move || {
        let opts = NodeOptions {
            name: "scripted".into(),
            connect_timeout: SCRIPTED_DEADLINE,
            ..NodeOptions::default()
        };
        run_node(&addr.to_string(), SCRIPTED_TOKEN, opts).map_err(|e| e.to_string())
    });
    let (s, _) = listener.accept().expect("accept");
    s.set_read_timeout(Some(SCRIPTED_DEADLINE)).expect("timeout");
    let mut t = Scripted { s };
    let mut hs = TrainerHandshake::new(SCRIPTED_TOKEN, vec![7; NONCE_LEN]);
    loop {
        let mut prefix = [0u8; 4];
        t.s.read_exact(&mut prefix).expect("a handshake frame");
        let mut body = vec![0u8; u32::from_be_bytes(prefix) as usize];
        t.s.read_exact(&mut body).expect("a handshake frame");
        match hs.on_frame(&body) {
            HandshakeStep::Send(f) => t.send(&f),
            HandshakeStep::Reject(reason) => panic!("the node failed the handshake: {reason}"),
            HandshakeStep::Authenticated { .. } => break,
        }
    }
    let welcome = Welcome {
        node_index: 0,
        spec,
        weights,
        heartbeat_ms,
        heartbeat_timeout_ms: 30_000,
        max_frame: DEFAULT_MAX_FRAME as u64,
    };
    t.send(&TrainerFrame::Welcome(Box::new(welcome)));
    (t, node)
}

/// The node thread's result, within [`SCRIPTED_DEADLINE`].
pub fn scripted_node_result(node: JoinHandle<Result<(), String>>) -> Result<(), String> {
    wait_until(Instant::now() + SCRIPTED_DEADLINE, "the node to stop", || {
        node.is_finished()
    });
    node.join().expect("node thread")
}
