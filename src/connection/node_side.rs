//! The node's side of a connection: the handshake that gets it admitted (hello,
//! proof of the token, welcome), then the session — heartbeat deadlines, `Ready`
//! first, and the end of the session when the node says `Down`.

use std::time::{Duration, Instant};

use super::liveness::{Liveness, Tick};
use super::Inbound;
use crate::message::{FromNode, ToNode};
use crate::peer_text::bounded;
use crate::schema::BatchLayout;
use crate::space::EnvSpecs;
use crate::wire::{auth_proof, Auth, Hello, NodeFrame, TrainerFrame, Welcome, PROTOCOL_VERSION};

/// What the node does next in its handshake.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeStep {
    /// Send this frame and wait for the trainer's next one.
    Send(NodeFrame),
    /// Admitted: build the node this says and start the session.
    Welcomed(Box<Welcome>),
    /// The trainer refused this node, for this reason.
    Rejected(String),
    /// The trainer broke the protocol.
    Violation(String),
}

/// Where the node's handshake is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// `Hello` not sent yet.
    Start,
    /// `Hello` sent, waiting for the challenge.
    Hello,
    /// The proof sent, waiting for `Welcome` or `Reject`.
    Proved,
    /// Over, one way or the other.
    Done,
}

/// The node's side of one connection's handshake, as a state machine.
#[derive(Debug)]
pub struct NodeHandshake {
    token: Vec<u8>,
    name: String,
    index: Option<usize>,
    stage: Stage,
}

impl NodeHandshake {
    /// A node named `name` proving it holds `token`, asking for slot `index` (or any).
    pub fn new(token: &[u8], name: String, index: Option<usize>) -> NodeHandshake {
        NodeHandshake {
            token: token.to_vec(),
            name,
            index,
            stage: Stage::Start,
        }
    }

    /// The first frame of the connection.
    pub fn hello(&mut self) -> NodeFrame {
        self.stage = Stage::Hello;
        NodeFrame::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            node_name: self.name.clone(),
            node_index: self.index,
        })
    }

    /// The trainer's next frame.
    pub fn on_frame(&mut self, frame: TrainerFrame) -> NodeStep {
        let stage = std::mem::replace(&mut self.stage, Stage::Done);
        match (stage, frame) {
            // The trainer's words, bounded and escaped for the node's log and error.
            (Stage::Hello | Stage::Proved, TrainerFrame::Reject { reason }) => NodeStep::Rejected(bounded(&reason)),
            (Stage::Hello, TrainerFrame::Challenge { nonce }) => {
                self.stage = Stage::Proved;
                NodeStep::Send(NodeFrame::Auth(Auth {
                    proof: auth_proof(&self.token, &nonce, &self.name),
                }))
            }
            (Stage::Hello, _) => NodeStep::Violation("expected a challenge".into()),
            (Stage::Proved, TrainerFrame::Welcome(w)) => NodeStep::Welcomed(w),
            (Stage::Proved, _) => NodeStep::Violation("expected welcome or reject".into()),
            (Stage::Start, _) => NodeStep::Violation("a frame before hello".into()),
            (Stage::Done, _) => NodeStep::Violation("handshake already finished".into()),
        }
    }
}

/// The node's side of its connection after the handshake.
///
/// Its heartbeats answer the trainer's: a trainer heartbeat is answered at once
/// ([`Inbound::Answer`]) unless the node sent one less than half an interval ago,
/// and the node's own timer ([`NodeSession::next_beat`]) fires only if the
/// trainer's next beat is a quarter interval late. So a trainer's nodes beat on
/// its clock (their heartbeats arrive together and ride with the TCP
/// acknowledgement of its own), and a node whose trainer went quiet still sends
/// one at least every 1.25 intervals, well inside any timeout of two or more.
#[derive(Debug)]
pub struct NodeSession {
    index: usize,
    live: Liveness,
    /// When this node last sent a heartbeat (or the session began).
    beat_sent: Instant,
}

impl NodeSession {
    /// The session `welcome` opened, from `now`.
    pub fn new(welcome: &Welcome, now: Instant) -> NodeSession {
        let heartbeat = Duration::from_millis(welcome.heartbeat_ms.max(1));
        let timeout = Duration::from_millis(welcome.heartbeat_timeout_ms.max(1));
        NodeSession {
            index: welcome.node_index,
            live: Liveness::new(heartbeat, timeout, now),
            beat_sent: now,
        }
    }

    /// This node's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The heartbeat interval the trainer set.
    pub fn heartbeat(&self) -> Duration {
        self.live.interval()
    }

    /// When the shell fires [`NodeSession::on_tick`] if no trainer heartbeat was
    /// answered before: a quarter interval after the trainer's next beat was due.
    pub fn next_beat(&self) -> Instant {
        let t = self.live.interval();
        self.beat_sent + t + t / 4
    }

    /// The shell sent a heartbeat at `now` (on a tick, or answering the trainer's).
    pub fn beat_sent(&mut self, now: Instant) {
        self.beat_sent = now;
    }

    /// The first frame after the handshake, before any other: the layout of every
    /// batch the node will send (a trainer closes on a `Batch` before it) and its env's
    /// specs, from which a trainer that cannot build the env learns them.
    pub fn ready(&self, layout: BatchLayout, specs: Option<EnvSpecs>) -> NodeFrame {
        NodeFrame::Message(FromNode::Ready {
            node: self.index,
            layout,
            specs: specs.map(Box::new),
        })
    }

    /// Something (a frame, or bytes that were none) came in at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.live.heard(now);
    }

    /// A frame the trainer sent, decoded, at `now`.
    pub fn on_frame(&mut self, frame: TrainerFrame, now: Instant) -> Inbound<ToNode> {
        self.heard(now);
        match frame {
            // Answered unless this node beat half an interval ago or less (its own
            // timer came first, or the trainer's beats come closer than its interval).
            TrainerFrame::Heartbeat if now.saturating_duration_since(self.beat_sent) >= self.live.interval() / 2 => {
                Inbound::Answer
            }
            TrainerFrame::Heartbeat => Inbound::Nothing,
            TrainerFrame::Message(m) => Inbound::Deliver(m),
            TrainerFrame::Challenge { .. } | TrainerFrame::Welcome(_) | TrainerFrame::Reject { .. } => {
                Inbound::Close("handshake frame after the handshake".into())
            }
        }
    }

    /// The heartbeat timer fired at `now`: send a heartbeat (then
    /// [`NodeSession::beat_sent`]), or leave.
    pub fn on_tick(&self, now: Instant) -> Result<(), String> {
        match self.live.tick(now) {
            Tick::Heartbeat => Ok(()),
            Tick::Silent(t) => Err(format!("no frame from the trainer for {:.1} s", t.as_secs_f64())),
        }
    }

    /// True if sending `msg` ends the session: after `Down` or `Leave` the node has left.
    pub fn ends(msg: &FromNode) -> bool {
        matches!(msg, FromNode::Down { .. } | FromNode::Leave { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::trainer_side::{HandshakeStep, TrainerHandshake};
    use crate::message::{Continue, Seed};
    use crate::node_spec::NodeSpec;
    use crate::policy::PolicyConfig;
    use crate::wire::{encode, NONCE_LEN, PREFIX_LEN};

    fn body(f: &NodeFrame) -> Vec<u8> {
        encode(f, usize::MAX).unwrap()[PREFIX_LEN..].to_vec()
    }

    fn welcome(index: usize) -> Welcome {
        Welcome {
            node_index: index,
            spec: NodeSpec::new("CartPole-v1", PolicyConfig::Mlp { hidden: vec![8] }, 1).with_index(index),
            weights: None,
            heartbeat_ms: 100,
            heartbeat_timeout_ms: 500,
            max_frame: 1 << 20,
        }
    }

    #[test]
    fn a_node_and_a_trainer_handshake_with_each_other() {
        let nonce: Vec<u8> = (0..NONCE_LEN as u8).collect();
        let mut node = NodeHandshake::new(b"secret", "node-0".into(), Some(1));
        let mut trainer = TrainerHandshake::new(b"secret", nonce.clone());
        let HandshakeStep::Send(challenge) = trainer.on_frame(&body(&node.hello())) else {
            panic!("a challenge")
        };
        assert_eq!(challenge, TrainerFrame::Challenge { nonce });
        let NodeStep::Send(auth) = node.on_frame(challenge) else {
            panic!("a proof")
        };
        assert_eq!(
            trainer.on_frame(&body(&auth)),
            HandshakeStep::Authenticated {
                node_name: "node-0".into(),
                node_index: Some(1)
            }
        );
        let w = TrainerFrame::Welcome(Box::new(welcome(1)));
        assert_eq!(node.on_frame(w), NodeStep::Welcomed(Box::new(welcome(1))));
        assert_eq!(
            node.on_frame(TrainerFrame::Heartbeat),
            NodeStep::Violation("handshake already finished".into())
        );
    }

    #[test]
    fn a_trainers_long_rejection_is_heard_bounded_and_escaped() {
        let mut hs = NodeHandshake::new(b"t", "n".into(), None);
        hs.hello();
        let reason = "no\u{1b}]0;pwned\u{7}".repeat(10_000);
        let NodeStep::Rejected(heard) = hs.on_frame(TrainerFrame::Reject { reason: reason.clone() }) else {
            panic!("not rejected");
        };
        assert!(heard.starts_with("no\\u{1b}]0;pwned\\u{7}"), "{heard}");
        assert!(heard.ends_with(&format!(" … ({} bytes)", reason.len())), "{heard}");
        assert!(heard.len() <= crate::peer_text::MAX_PRINTED, "{heard}");
    }

    #[test]
    fn the_node_hears_a_rejection_and_refuses_frames_out_of_order() {
        let reject = || TrainerFrame::Reject { reason: "no".into() };
        let mut hs = NodeHandshake::new(b"t", "n".into(), None);
        hs.hello();
        assert_eq!(hs.on_frame(reject()), NodeStep::Rejected("no".into()));
        let mut hs = NodeHandshake::new(b"t", "n".into(), None);
        hs.hello();
        assert!(matches!(
            hs.on_frame(TrainerFrame::Challenge { nonce: vec![1] }),
            NodeStep::Send(_)
        ));
        assert_eq!(hs.on_frame(reject()), NodeStep::Rejected("no".into()));
        let mut hs = NodeHandshake::new(b"t", "n".into(), None);
        hs.hello();
        assert_eq!(
            hs.on_frame(TrainerFrame::Welcome(Box::new(welcome(0)))),
            NodeStep::Violation("expected a challenge".into())
        );
        let mut hs = NodeHandshake::new(b"t", "n".into(), None);
        hs.hello();
        assert!(matches!(
            hs.on_frame(TrainerFrame::Challenge { nonce: vec![1] }),
            NodeStep::Send(_)
        ));
        assert_eq!(
            hs.on_frame(TrainerFrame::Heartbeat),
            NodeStep::Violation("expected welcome or reject".into())
        );
        let mut hs = NodeHandshake::new(b"t", "n".into(), None);
        assert_eq!(
            hs.on_frame(TrainerFrame::Heartbeat),
            NodeStep::Violation("a frame before hello".into())
        );
    }

    #[test]
    fn the_session_delivers_messages_and_closes_on_handshake_frames() {
        let t0 = Instant::now();
        let mut s = NodeSession::new(&welcome(2), t0);
        assert_eq!(s.index(), 2);
        assert_eq!(s.on_frame(TrainerFrame::Heartbeat, t0), Inbound::Nothing);
        let c = ToNode::Continue(Continue { seq: 1, frames: 8 });
        assert_eq!(s.on_frame(TrainerFrame::Message(c.clone()), t0), Inbound::Deliver(c));
        let seed = ToNode::Seed(Seed { seed: 4 });
        assert_eq!(
            s.on_frame(TrainerFrame::Message(seed.clone()), t0),
            Inbound::Deliver(seed)
        );
        for f in [
            TrainerFrame::Challenge { nonce: vec![] },
            TrainerFrame::Reject { reason: "x".into() },
            TrainerFrame::Welcome(Box::new(welcome(2))),
        ] {
            assert_eq!(
                s.on_frame(f, t0),
                Inbound::Close("handshake frame after the handshake".into())
            );
        }
        assert!(matches!(
            s.ready(BatchLayout::default(), None),
            NodeFrame::Message(FromNode::Ready { node: 2, .. })
        ));
        assert!(NodeSession::ends(&FromNode::Down { node: 2 }));
        assert!(NodeSession::ends(&FromNode::Leave { node: 2 }));
        assert!(!NodeSession::ends(&FromNode::Restored { node: 2 }));
    }

    #[test]
    fn the_node_leaves_when_the_trainer_is_silent_past_the_welcomes_timeout() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = NodeSession::new(&welcome(0), t0);
        assert_eq!(s.heartbeat(), ms(100));
        assert_eq!(s.on_tick(t0 + ms(500)), Ok(()));
        assert_eq!(
            s.on_tick(t0 + ms(501)),
            Err("no frame from the trainer for 0.5 s".into())
        );
        s.heard(t0 + ms(501));
        assert_eq!(s.on_tick(t0 + ms(900)), Ok(()));
        // Zero in a welcome means at least a millisecond, not a busy timer.
        let mut w = welcome(0);
        w.heartbeat_ms = 0;
        w.heartbeat_timeout_ms = 0;
        assert_eq!(NodeSession::new(&w, t0).heartbeat(), ms(1));
    }

    #[test]
    fn the_trainers_beat_is_answered_and_the_nodes_own_timer_waits_for_it() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = NodeSession::new(&welcome(0), t0);
        // Before any beat: the own timer is due 1.25 intervals after the session began.
        assert_eq!(s.next_beat(), t0 + ms(125));
        // The trainer's beat 70 ms in (over half an interval since the session began):
        // answered, and the own timer now counts from the answer.
        assert_eq!(s.on_frame(TrainerFrame::Heartbeat, t0 + ms(70)), Inbound::Answer);
        s.beat_sent(t0 + ms(70));
        assert_eq!(s.next_beat(), t0 + ms(195));
        // A second beat soon after (less than half an interval): heard, not answered.
        assert_eq!(s.on_frame(TrainerFrame::Heartbeat, t0 + ms(110)), Inbound::Nothing);
        // The trainer's next beat on time: answered again, before the own timer.
        assert_eq!(s.on_frame(TrainerFrame::Heartbeat, t0 + ms(170)), Inbound::Answer);
        s.beat_sent(t0 + ms(170));
        assert_eq!(s.next_beat(), t0 + ms(295));
        // The own timer came first (the trainer's beat was late): the late beat, less
        // than half an interval after, is not answered a second time.
        s.beat_sent(t0 + ms(295));
        assert_eq!(s.on_frame(TrainerFrame::Heartbeat, t0 + ms(300)), Inbound::Nothing);
        // Other frames are never answered with a heartbeat.
        let m = ToNode::Seed(Seed { seed: 1 });
        assert_eq!(
            s.on_frame(TrainerFrame::Message(m.clone()), t0 + ms(900)),
            Inbound::Deliver(m)
        );
    }
}
