//! The trainer's side of a connection: the handshake that admits a node (refusing at
//! `hello` a protocol version the run cannot be served by), then the session with it —
//! heartbeat deadlines, and the rules of what a node may send when: `Ready` once and
//! before any `Batch`, every message in its own name.

use std::time::{Duration, Instant};

use super::liveness::{Liveness, Tick};
use super::Inbound;
use crate::message::FromNode;
use crate::peer_text::{bounded, Bounded};
use crate::wire::{decode_login, verify_proof, AdmitVersions, Auth, Hello, LoginFrame, NodeFrame, TrainerFrame};

/// What the trainer does next in a handshake.
#[derive(Clone, Debug, PartialEq)]
pub enum HandshakeStep {
    /// Send this frame and wait for the next one.
    Send(TrainerFrame),
    /// The node proved the token; admit it (or not) by index.
    Authenticated {
        /// Its name.
        node_name: String,
        /// The index it asked for.
        node_index: Option<usize>,
    },
    /// Send `Reject { reason }` and close.
    Reject(String),
}

/// The trainer's side of one connection's handshake, as a state machine.
#[derive(Debug)]
pub struct TrainerHandshake {
    token: Vec<u8>,
    nonce: Vec<u8>,
    versions: AdmitVersions,
    hello: Option<(String, Option<usize>)>,
    done: bool,
}

impl TrainerHandshake {
    /// A handshake that will challenge with `nonce` (random, [`NONCE_LEN`](crate::wire::NONCE_LEN) bytes),
    /// admitting every protocol version this trainer speaks ([`AdmitVersions::all`]).
    pub fn new(token: &[u8], nonce: Vec<u8>) -> TrainerHandshake {
        TrainerHandshake {
            token: token.to_vec(),
            nonce,
            versions: AdmitVersions::all(),
            hello: None,
            done: false,
        }
    }

    /// The same handshake admitting only `versions`, those that can serve the run: a
    /// `hello` of any other is refused with the reason [`AdmitVersions::check`] gives.
    pub fn admitting(mut self, versions: AdmitVersions) -> TrainerHandshake {
        self.versions = versions;
        self
    }

    /// Feeds the next frame body the node sent.
    pub fn on_frame(&mut self, body: &[u8]) -> HandshakeStep {
        if self.done {
            return HandshakeStep::Reject("handshake already finished".into());
        }
        // Strict and bounded: this frame comes from anyone who can reach the port.
        let frame = match decode_login(body) {
            Ok(f) => f,
            Err(e) => {
                self.done = true;
                return HandshakeStep::Reject(format!("malformed handshake frame: {e}"));
            }
        };
        match (&self.hello, frame) {
            (
                None,
                LoginFrame::Hello(Hello {
                    protocol_version,
                    node_name,
                    node_index,
                }),
            ) => {
                if let Err(reason) = self.versions.check(protocol_version) {
                    self.done = true;
                    return HandshakeStep::Reject(reason);
                }
                if node_name.len() > 256 {
                    self.done = true;
                    return HandshakeStep::Reject("node name longer than 256 bytes".into());
                }
                self.hello = Some((node_name, node_index));
                HandshakeStep::Send(TrainerFrame::Challenge {
                    nonce: self.nonce.clone(),
                })
            }
            (Some((name, index)), LoginFrame::Auth(Auth { proof })) => {
                self.done = true;
                if verify_proof(&self.token, &self.nonce, name, &proof) {
                    HandshakeStep::Authenticated {
                        node_name: name.clone(),
                        node_index: *index,
                    }
                } else {
                    HandshakeStep::Reject("authentication failed: wrong token".into())
                }
            }
            (None, other) => {
                self.done = true;
                HandshakeStep::Reject(format!("expected hello, got {}", login_name(&other)))
            }
            (Some(_), other) => {
                self.done = true;
                HandshakeStep::Reject(format!("expected auth, got {}", login_name(&other)))
            }
        }
    }
}

/// A login frame's `type`, for refusals.
fn login_name(f: &LoginFrame) -> &'static str {
    match f {
        LoginFrame::Hello(_) => "hello",
        LoginFrame::Auth(_) => "auth",
        LoginFrame::Other(t) => t,
    }
}

/// The trainer's side of one admitted node's connection, after the handshake.
#[derive(Debug)]
pub struct TrainerSession {
    index: usize,
    name: String,
    live: Liveness,
    /// The node sent its `Ready` (its batch layout).
    ready: bool,
    /// The node said `Down`: it left on purpose, its connection closing is no failure.
    down: bool,
    /// The node said `Failed`: it closes next (PROTOCOL.md §5), and says nothing more.
    said_failed: bool,
    closed: bool,
}

/// A connection to close, and what the trainer is told about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Closing {
    /// For the log.
    pub reason: String,
    /// The node's failure, for the trainer; `None` when the node had said `Down`
    /// (its connection closing then is how a node leaves).
    pub failed: Option<FromNode>,
}

impl TrainerSession {
    /// The session with node `index` (named `name`, for messages), heartbeats every
    /// `heartbeat`, gone after `timeout` of silence, from `now`.
    pub fn new(index: usize, name: String, heartbeat: Duration, timeout: Duration, now: Instant) -> TrainerSession {
        TrainerSession {
            index,
            name,
            live: Liveness::new(heartbeat, timeout, now),
            ready: false,
            down: false,
            said_failed: false,
            closed: false,
        }
    }

    /// The node's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// How often the shell fires [`TrainerSession::on_tick`].
    pub fn heartbeat(&self) -> Duration {
        self.live.interval()
    }

    /// The connection was closed ([`TrainerSession::close`]): nothing more goes out.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The node said `Down`.
    pub fn went_down(&self) -> bool {
        self.down
    }

    /// Something (a frame, or bytes that were none) came in at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.live.heard(now);
    }

    /// A frame the node sent, decoded, at `now`.
    pub fn on_frame(&mut self, frame: NodeFrame, now: Instant) -> Inbound<FromNode> {
        self.heard(now);
        let mut msg = match frame {
            NodeFrame::Heartbeat => return Inbound::Nothing,
            NodeFrame::Message(m) => m,
            NodeFrame::Hello(_) | NodeFrame::Auth(_) => {
                return Inbound::Close("handshake frame after the handshake".into())
            }
        };
        if msg.node() != self.index {
            return Inbound::Close(format!("node {} sent a message as node {}", self.index, msg.node()));
        }
        if self.said_failed {
            // A node closes after `failed`: more from it is a protocol violation, not
            // a second failure (each would be logged: a peer's words are bounded per
            // connection).
            return Inbound::Close(format!("{} after its failed", msg.name()));
        }
        match &mut msg {
            // The node's words, bounded and escaped here as they enter: nothing
            // downstream (logs, errors, the summary) can print them whole.
            FromNode::Failed { reason, .. } => {
                *reason = bounded(reason);
                self.said_failed = true;
            }
            FromNode::CheckpointFailed { reason, .. } => *reason = bounded(reason),
            // It left on purpose: its connection closing next is no failure.
            FromNode::Down { .. } | FromNode::Leave { .. } => self.down = true,
            FromNode::Ready { .. } if self.ready => return Inbound::Close("a second Ready".into()),
            FromNode::Ready { .. } => self.ready = true,
            FromNode::Batch(_) if !self.ready => {
                return Inbound::Close("a Batch before Ready (the node's batch layout)".into())
            }
            _ => {}
        }
        Inbound::Deliver(msg)
    }

    /// The heartbeat timer fired at `now`: send a heartbeat, or close.
    pub fn on_tick(&self, now: Instant) -> Result<(), String> {
        match self.live.tick(now) {
            Tick::Heartbeat => Ok(()),
            Tick::Silent(t) => Err(format!("no frame for {:.1} s (heartbeat timeout)", t.as_secs_f64())),
        }
    }

    /// The connection is to close for `reason` (a rule broken, silence, the socket):
    /// what to tell the trainer, the first time only (`None` after).
    pub fn close(&mut self, reason: String) -> Option<Closing> {
        if std::mem::replace(&mut self.closed, true) {
            return None;
        }
        // A node that said `Failed` was heard: its closing is no second failure.
        let failed = (!self.down && !self.said_failed).then(|| FromNode::Failed {
            node: self.index,
            reason: format!("connection to {}: {reason}", Bounded(&self.name)),
        });
        Some(Closing { reason, failed })
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, IxDyn};

    use super::*;
    use crate::message::Batch;
    use crate::tensor::{Tensor, TensorDict};
    use crate::wire::{auth_proof, encode, Need, NONCE_LEN, OLDEST_PROTOCOL_VERSION, PREFIX_LEN, PROTOCOL_VERSION};

    const TOKEN: &[u8] = b"secret";

    fn nonce() -> Vec<u8> {
        (0..NONCE_LEN as u8).collect()
    }

    fn body(f: &impl serde::Serialize) -> Vec<u8> {
        encode(f, usize::MAX).unwrap()[PREFIX_LEN..].to_vec()
    }

    fn batch() -> Batch {
        batch_of(1)
    }

    fn batch_of(node: usize) -> Batch {
        let obs = Tensor::F32(ArrayD::zeros(IxDyn(&[2, 3, 4])));
        Batch {
            node,
            seq: 9,
            weights_version: 3,
            data: TensorDict::from_entries(&[2, 3], [("observation".to_string(), obs)]).unwrap(),
        }
    }

    fn hello(name: &str, version: u32, index: Option<usize>) -> Vec<u8> {
        body(&NodeFrame::Hello(Hello {
            protocol_version: version,
            node_name: name.into(),
            node_index: index,
        }))
    }

    fn auth(token: &[u8], nonce: &[u8], name: &str) -> Vec<u8> {
        body(&NodeFrame::Auth(Auth {
            proof: auth_proof(token, nonce, name),
        }))
    }

    fn rejected(step: HandshakeStep, needle: &str) {
        match step {
            HandshakeStep::Reject(reason) => assert!(reason.contains(needle), "{reason:?} lacks {needle:?}"),
            other => panic!("expected a rejection containing {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn handshake_happy_path() {
        let mut hs = TrainerHandshake::new(TOKEN, nonce());
        assert_eq!(
            hs.on_frame(&hello("node-0", PROTOCOL_VERSION, Some(1))),
            HandshakeStep::Send(TrainerFrame::Challenge { nonce: nonce() })
        );
        assert_eq!(
            hs.on_frame(&auth(TOKEN, &nonce(), "node-0")),
            HandshakeStep::Authenticated {
                node_name: "node-0".into(),
                node_index: Some(1),
            }
        );
        rejected(hs.on_frame(&body(&NodeFrame::Heartbeat)), "already finished");

        let mut hs = TrainerHandshake::new(TOKEN, nonce());
        assert!(matches!(
            hs.on_frame(&hello("", PROTOCOL_VERSION, None)),
            HandshakeStep::Send(_)
        ));
        assert_eq!(
            hs.on_frame(&auth(TOKEN, &nonce(), "")),
            HandshakeStep::Authenticated {
                node_name: String::new(),
                node_index: None,
            }
        );
    }

    #[test]
    fn handshake_rejections() {
        let start = || {
            let mut hs = TrainerHandshake::new(TOKEN, nonce());
            assert!(matches!(
                hs.on_frame(&hello("node-0", PROTOCOL_VERSION, None)),
                HandshakeStep::Send(_)
            ));
            hs
        };
        // Wrong token.
        rejected(start().on_frame(&auth(b"guess", &nonce(), "node-0")), "wrong token");
        // A proof made for another node name (or another nonce) fails.
        rejected(start().on_frame(&auth(TOKEN, &nonce(), "node-1")), "wrong token");
        rejected(start().on_frame(&auth(TOKEN, &[9; NONCE_LEN], "node-0")), "wrong token");
        rejected(
            start().on_frame(&body(&NodeFrame::Auth(Auth { proof: vec![] }))),
            "wrong token",
        );
        // Wrong version.
        let mut hs = TrainerHandshake::new(TOKEN, nonce());
        rejected(hs.on_frame(&hello("node-0", 99, None)), "protocol version 99");
        rejected(hs.on_frame(&auth(TOKEN, &nonce(), "node-0")), "already finished");
        rejected(
            TrainerHandshake::new(TOKEN, nonce()).on_frame(&hello("node-0", OLDEST_PROTOCOL_VERSION - 1, None)),
            "protocol version 2 is not supported (this trainer speaks 3 to 13)",
        );
        // Version 3 (no specs in `ready`), 4 (no recorded keys) and 5 are admitted by a
        // handshake told nothing of the run.
        for v in OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION {
            assert!(
                matches!(
                    TrainerHandshake::new(TOKEN, nonce()).on_frame(&hello("node-0", v, None)),
                    HandshakeStep::Send(TrainerFrame::Challenge { .. })
                ),
                "version {v}"
            );
        }
        // Wrong first frame; Auth before Hello.
        rejected(
            TrainerHandshake::new(TOKEN, nonce()).on_frame(&body(&NodeFrame::Heartbeat)),
            "expected hello, got heartbeat",
        );
        rejected(
            TrainerHandshake::new(TOKEN, nonce()).on_frame(&body(&NodeFrame::Message(FromNode::Batch(batch())))),
            "expected hello, got batch",
        );
        let mut hs = TrainerHandshake::new(TOKEN, nonce());
        rejected(
            hs.on_frame(&auth(TOKEN, &nonce(), "node-0")),
            "expected hello, got auth",
        );
        rejected(
            hs.on_frame(&hello("node-0", PROTOCOL_VERSION, None)),
            "already finished",
        );
        // Wrong second frame.
        rejected(
            start().on_frame(&hello("node-0", PROTOCOL_VERSION, None)),
            "expected auth, got hello",
        );
        rejected(
            start().on_frame(&body(&NodeFrame::Message(FromNode::Down { node: 0 }))),
            "expected auth, got down",
        );
        // Malformed bytes, first or second.
        rejected(
            TrainerHandshake::new(TOKEN, nonce()).on_frame(&[0xc1, 0x00]),
            "malformed",
        );
        rejected(TrainerHandshake::new(TOKEN, nonce()).on_frame(&[]), "malformed");
        rejected(start().on_frame(b"\x81\xa4type\xa4auth"), "malformed");
        // A trainer frame sent by the node.
        rejected(
            TrainerHandshake::new(TOKEN, nonce()).on_frame(&body(&TrainerFrame::Challenge { nonce: nonce() })),
            "malformed",
        );
        // Absurd names.
        rejected(
            TrainerHandshake::new(TOKEN, nonce()).on_frame(&hello(&"x".repeat(257), PROTOCOL_VERSION, None)),
            "longer than 256",
        );
    }

    /// A handshake for a run that needs `need`, fed a `hello` of `version`.
    fn hello_to_a_run_needing(need: Option<Need>, version: u32) -> (TrainerHandshake, HandshakeStep) {
        let versions = AdmitVersions::serving(need);
        let mut hs = TrainerHandshake::new(TOKEN, nonce()).admitting(versions);
        let step = hs.on_frame(&hello("node-0", version, Some(0)));
        (hs, step)
    }

    #[test]
    fn a_version_that_cannot_serve_the_run_is_refused_at_hello_naming_the_versions() {
        let recorded = || Some(Need::Recorded { policy: "mlp".into() });
        let specs = || Some(Need::Specs { env: "Custom".into() });
        // A policy that records log-probabilities: only versions 5 to 13 serve it.
        for v in [3, 4] {
            let (mut hs, step) = hello_to_a_run_needing(recorded(), v);
            rejected(
                step,
                &format!(
                    "protocol version {v} cannot serve this run: its policy (mlp) records action_log_prob and its \
                     distribution's parameters in every batch (version 5); this run admits 5 to 13 (this trainer \
                     speaks 3 to 13"
                ),
            );
            // Refused before the challenge: no proof is even asked for.
            rejected(hs.on_frame(&auth(TOKEN, &nonce(), "node-0")), "already finished");
        }
        let (mut hs, step) = hello_to_a_run_needing(recorded(), 5);
        assert_eq!(step, HandshakeStep::Send(TrainerFrame::Challenge { nonce: nonce() }));
        assert_eq!(
            hs.on_frame(&auth(TOKEN, &nonce(), "node-0")),
            HandshakeStep::Authenticated {
                node_name: "node-0".into(),
                node_index: Some(0),
            }
        );
        // An env only the nodes know: version 3 sends no specs; 4 and 5 do.
        rejected(
            hello_to_a_run_needing(specs(), 3).1,
            "protocol version 3 cannot serve this run: its env Custom is known only to its nodes, which report \
             its spaces in ready's specs (version 4); this run admits 4 to 13",
        );
        for v in [4, 5, 6, 7, 8] {
            assert!(
                matches!(
                    hello_to_a_run_needing(specs(), v).1,
                    HandshakeStep::Send(TrainerFrame::Challenge { .. })
                ),
                "version {v}"
            );
        }
        // A run that needs nothing of the newer versions admits all five.
        for v in 3..=7 {
            assert!(
                matches!(
                    hello_to_a_run_needing(None, v).1,
                    HandshakeStep::Send(TrainerFrame::Challenge { .. })
                ),
                "version {v}"
            );
        }
        // Outside what the trainer speaks, the run's versions are named too.
        rejected(
            hello_to_a_run_needing(recorded(), 14).1,
            "protocol version 14 is not supported (this trainer speaks 3 to 13; this run admits 5 to 13)",
        );
        // A recurrent policy: version 5 knows no state.
        rejected(
            hello_to_a_run_needing(Some(Need::Recurrent), 5).1,
            "protocol version 5 cannot serve this run: its policy is a recurrent onnx model",
        );
        // An exploration module: version 6 knows none.
        rejected(
            hello_to_a_run_needing(Some(Need::Exploration), 6).1,
            "protocol version 6 cannot serve this run: its onnx policy has an exploration module",
        );
    }

    fn ready(node: usize) -> NodeFrame {
        NodeFrame::Message(FromNode::Ready {
            node,
            layout: Default::default(),
            specs: None,
        })
    }

    fn session(now: Instant) -> TrainerSession {
        TrainerSession::new(
            1,
            "n1".into(),
            Duration::from_millis(100),
            Duration::from_millis(500),
            now,
        )
    }

    fn closes(i: Inbound<FromNode>, needle: &str) {
        match i {
            Inbound::Close(reason) => assert!(reason.contains(needle), "{reason:?} lacks {needle:?}"),
            other => panic!("expected a close for {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn a_session_delivers_ready_then_batches_and_heartbeats_are_only_heard() {
        let t0 = Instant::now();
        let mut s = session(t0);
        assert_eq!(s.on_frame(NodeFrame::Heartbeat, t0), Inbound::Nothing);
        assert!(matches!(
            s.on_frame(ready(1), t0),
            Inbound::Deliver(FromNode::Ready { node: 1, .. })
        ));
        let b = FromNode::Batch(batch());
        assert_eq!(s.on_frame(NodeFrame::Message(b.clone()), t0), Inbound::Deliver(b));
        let w = FromNode::WeightsUpdated { node: 1, version: 2 };
        assert_eq!(s.on_frame(NodeFrame::Message(w.clone()), t0), Inbound::Deliver(w));
    }

    #[test]
    fn a_batch_before_ready_a_second_ready_and_handshake_frames_close_the_session() {
        let t0 = Instant::now();
        closes(
            session(t0).on_frame(NodeFrame::Message(FromNode::Batch(batch())), t0),
            "a Batch before Ready",
        );
        let mut s = session(t0);
        assert!(matches!(s.on_frame(ready(1), t0), Inbound::Deliver(_)));
        closes(s.on_frame(ready(1), t0), "a second Ready");
        let hello = NodeFrame::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            node_name: "n1".into(),
            node_index: None,
        });
        closes(session(t0).on_frame(hello, t0), "handshake frame after the handshake");
        closes(
            session(t0).on_frame(NodeFrame::Auth(Auth { proof: vec![] }), t0),
            "handshake frame after the handshake",
        );
        // Messages other than a batch may come before Ready (a node failing to build).
        let f = FromNode::Failed {
            node: 1,
            reason: "x".into(),
        };
        assert_eq!(
            session(t0).on_frame(NodeFrame::Message(f.clone()), t0),
            Inbound::Deliver(f)
        );
    }

    #[test]
    fn a_message_in_another_nodes_name_closes_the_session() {
        let t0 = Instant::now();
        let mut s = session(t0);
        assert!(matches!(s.on_frame(ready(1), t0), Inbound::Deliver(_)));
        closes(
            s.on_frame(NodeFrame::Message(FromNode::Batch(batch_of(0))), t0),
            "node 1 sent a message as node 0",
        );
        closes(session(t0).on_frame(ready(2), t0), "node 1 sent a message as node 2");
        closes(
            session(t0).on_frame(NodeFrame::Message(FromNode::Down { node: 0 }), t0),
            "as node 0",
        );
    }

    #[test]
    fn a_nodes_reasons_are_delivered_bounded_and_escaped() {
        let t0 = Instant::now();
        let long = "\u{1b}[2J\nERROR forged".repeat(1 << 16);
        let failed = FromNode::Failed {
            node: 1,
            reason: long.clone(),
        };
        let Inbound::Deliver(FromNode::Failed { reason, .. }) = session(t0).on_frame(NodeFrame::Message(failed), t0)
        else {
            panic!("failed not delivered");
        };
        assert_eq!(reason, crate::peer_text::bounded(&long));
        assert!(reason.starts_with("\\u{1b}[2J\\nERROR forged"), "{reason}");
        assert!(reason.ends_with(&format!(" … ({} bytes)", long.len())), "{reason}");
        let refused = FromNode::CheckpointFailed {
            node: 1,
            id: 3,
            reason: "\u{7}".repeat(10_000),
        };
        let Inbound::Deliver(FromNode::CheckpointFailed { reason, .. }) =
            session(t0).on_frame(NodeFrame::Message(refused), t0)
        else {
            panic!("checkpoint_failed not delivered");
        };
        assert!(reason.len() <= crate::peer_text::MAX_PRINTED, "{reason}");
        assert!(
            reason.ends_with(" … (10000 bytes)") && !reason.contains('\u{7}'),
            "{reason}"
        );
        // A hostile name is shown escaped in the failure a close reports.
        let mut s = TrainerSession::new(1, "n\n1".into(), Duration::from_millis(100), Duration::from_secs(1), t0);
        let c = s.close("gone".into()).expect("first close");
        assert!(matches!(c.failed, Some(FromNode::Failed { reason, .. }) if reason == "connection to n\\n1: gone"));
    }

    #[test]
    fn a_frame_after_failed_closes_the_session_without_a_second_failure() {
        let t0 = Instant::now();
        let mut s = session(t0);
        let f = FromNode::Failed {
            node: 1,
            reason: "x".into(),
        };
        assert_eq!(
            s.on_frame(NodeFrame::Message(f.clone()), t0),
            Inbound::Deliver(f.clone())
        );
        assert_eq!(s.on_frame(NodeFrame::Heartbeat, t0), Inbound::Nothing);
        closes(s.on_frame(NodeFrame::Message(f), t0), "failed after its failed");
        let w = FromNode::WeightsUpdated { node: 1, version: 2 };
        closes(
            s.on_frame(NodeFrame::Message(w), t0),
            "weights_updated after its failed",
        );
        assert_eq!(
            s.close("eof".into()).map(|c| c.failed),
            Some(None),
            "its failure was heard once"
        );
    }

    #[test]
    fn silence_past_the_timeout_closes_and_any_frame_counts_as_heard() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = session(t0);
        assert_eq!(s.heartbeat(), ms(100));
        assert_eq!(s.on_tick(t0 + ms(400)), Ok(()));
        assert_eq!(s.on_frame(NodeFrame::Heartbeat, t0 + ms(400)), Inbound::Nothing);
        assert_eq!(s.on_tick(t0 + ms(900)), Ok(()));
        let err = s.on_tick(t0 + ms(901)).unwrap_err();
        assert_eq!(err, "no frame for 0.5 s (heartbeat timeout)");
    }

    #[test]
    fn closing_reports_a_failure_once_and_none_after_down() {
        let t0 = Instant::now();
        let mut s = session(t0);
        let c = s.close("gone".into()).expect("first close");
        assert_eq!(c.reason, "gone");
        assert_eq!(
            c.failed,
            Some(FromNode::Failed {
                node: 1,
                reason: "connection to n1: gone".into()
            })
        );
        assert_eq!(s.close("again".into()), None, "closed once");
        assert!(s.is_closed());
        let mut s = session(t0);
        assert!(matches!(
            s.on_frame(NodeFrame::Message(FromNode::Down { node: 1 }), t0),
            Inbound::Deliver(FromNode::Down { node: 1 })
        ));
        assert!(s.went_down());
        assert_eq!(s.close("closed".into()).map(|c| c.failed), Some(None));
        let mut s = session(t0);
        assert!(matches!(
            s.on_frame(NodeFrame::Message(FromNode::Leave { node: 1 }), t0),
            Inbound::Deliver(FromNode::Leave { node: 1 })
        ));
        assert!(s.went_down(), "a node that left closes no failure");
        assert_eq!(s.close("closed".into()).map(|c| c.failed), Some(None));
    }
}
