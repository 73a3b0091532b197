//! A node's side of a connection written by hand (frames on a raw `TcpStream`), and the
//! library's own node beside it: what the scenarios that script a node, good or hostile,
//! are made of.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rollout::message::{Batch, Continue};
use rollout::wire::{self, Auth, Hello, NodeFrame, TrainerFrame, Welcome, PROTOCOL_VERSION};
use rollout::{Registry, TensorDict};
use rollout_actors::remote::{run_node, NodeOptions};

use crate::scratch::unique_name;
use crate::wait::wait_for;

/// Connects to `addr`, trying again until the trainer listens (at most `deadline`);
/// reads on the stream time out after `deadline` too.
pub fn connect(addr: SocketAddr, deadline: Duration) -> TcpStream {
    let end = Instant::now() + deadline;
    let s = wait_for(end, &format!("a connection to {addr}"), || {
        TcpStream::connect(addr).ok()
    });
    s.set_read_timeout(Some(deadline)).expect("read timeout");
    s
}

/// Writes `f` as one frame; errs when the trainer closed the connection.
pub fn try_send<T: serde::Serialize>(s: &mut TcpStream, f: &T) -> std::io::Result<()> {
    let bytes = wire::encode(f, wire::DEFAULT_MAX_FRAME).expect("encode");
    s.write_all(&bytes)
}

/// Writes `f` as one frame; panics when it cannot.
pub fn send<T: serde::Serialize>(s: &mut TcpStream, f: &T) {
    try_send(s, f).expect("write a frame");
}

/// The next frame from the trainer, or `None` once it closed the connection.
pub fn recv(s: &mut TcpStream) -> Option<TrainerFrame> {
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(prefix) as usize];
    s.read_exact(&mut body).ok()?;
    Some(wire::decode(&body).expect("the trainer sends valid frames"))
}

/// Sends `hello` for protocol `version` as `name` (asking for `index`, if given).
pub fn hello(s: &mut TcpStream, version: u32, name: &str, index: Option<usize>) {
    send(
        s,
        &NodeFrame::Hello(Hello {
            protocol_version: version,
            node_name: name.into(),
            node_index: index,
        }),
    );
}

/// The whole login with `token` as `name`: hello, the challenge, auth; the trainer's
/// answer (`welcome` or `reject`).
pub fn handshake(s: &mut TcpStream, token: &[u8], name: &str, index: Option<usize>) -> TrainerFrame {
    hello(s, PROTOCOL_VERSION, name, index);
    let Some(TrainerFrame::Challenge { nonce }) = recv(s) else {
        panic!("expected a challenge");
    };
    send(
        s,
        &NodeFrame::Auth(Auth {
            proof: wire::auth_proof(token, &nonce, name),
        }),
    );
    recv(s).expect("an answer to auth")
}

/// [`handshake`] that must end in `welcome`: the welcome.
pub fn logged_in(s: &mut TcpStream, token: &[u8], name: &str, index: Option<usize>) -> Welcome {
    match handshake(s, token, name, index) {
        TrainerFrame::Welcome(w) => *w,
        other => panic!("{name} was not admitted: {other:?}"),
    }
}

/// A correct answer to `c`: every worker of the welcome's spec collects its share
/// (built afresh, so from the start of its episodes), joined as a node joins them.
pub fn real_data(w: &Welcome, c: Continue) -> TensorDict {
    let mut workers = w.spec.build_workers(&Registry::with_builtins()).expect("workers");
    let per_worker = c.frames / workers.len();
    let mut shares: Vec<TensorDict> = workers
        .iter_mut()
        .map(|r| r.collect_frames(per_worker).expect("collect"))
        .collect();
    if shares.len() == 1 {
        return shares.remove(0);
    }
    TensorDict::cat(&shares).expect("cat")
}

/// [`real_data`] as the node's `batch` of version 0.
pub fn real_batch(w: &Welcome, c: Continue) -> Batch {
    Batch {
        node: w.node_index,
        seq: c.seq,
        weights_version: 0,
        data: real_data(w, c),
    }
}

/// A well-behaved node, the library's own, joining `addr` with `token` as `name` (asking
/// for `index`, if given), on a thread: how its run ended.
pub fn good_node_named(
    addr: SocketAddr,
    token: &'static [u8],
    index: Option<usize>,
    name: String,
) -> JoinHandle<Result<(), String>> {
    good_node_over(addr, token, index, name, None)
}

/// [`good_node_named`] joining over TLS with `tls` (plain TCP when `None`).
pub fn good_node_over(
    addr: SocketAddr,
    token: &'static [u8],
    index: Option<usize>,
    name: String,
    tls: Option<rollout_actors::remote::NodeTls>,
) -> JoinHandle<Result<(), String>> {
    thread::spawn(move || {
        let opts = NodeOptions {
            name,
            index,
            connect_timeout: Duration::from_secs(30),
            tls,
            ..NodeOptions::default()
        };
        run_node(&addr.to_string(), token, opts).map_err(|e| e.to_string())
    })
}

/// [`good_node_named`] under a name of its own ([`unique_name`] of `good`).
pub fn good_node(addr: SocketAddr, token: &'static [u8], index: Option<usize>) -> JoinHandle<Result<(), String>> {
    good_node_named(addr, token, index, unique_name("good"))
}
