//! The encoding of the two frame types: one map each, `type` first, naming the frame.
//!
//! A frame is either one of the wire's own (handshake, heartbeat) or a session
//! message (`ToNode`, `FromNode`) written exactly as that message serializes, so
//! the message types are the wire's vocabulary and no enum repeats their variants.
//! Decoding is `read.rs`'s.

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use super::{Auth, Hello, NodeFrame, TrainerFrame};
use crate::message::names::{AUTH, CHALLENGE, HEARTBEAT, HELLO, REJECT, TYPE as TAG, WELCOME};

impl Serialize for NodeFrame {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            NodeFrame::Message(m) => m.serialize(s),
            NodeFrame::Hello(Hello {
                protocol_version,
                node_name,
                node_index,
            }) => {
                let mut st = s.serialize_struct("NodeFrame", 4)?;
                st.serialize_field(TAG, HELLO)?;
                st.serialize_field("protocol_version", protocol_version)?;
                st.serialize_field("node_name", node_name)?;
                st.serialize_field("node_index", node_index)?;
                st.end()
            }
            NodeFrame::Auth(Auth { proof }) => {
                let mut st = s.serialize_struct("NodeFrame", 2)?;
                st.serialize_field(TAG, AUTH)?;
                st.serialize_field("proof", serde_bytes::Bytes::new(proof))?;
                st.end()
            }
            NodeFrame::Heartbeat => heartbeat(s, "NodeFrame"),
        }
    }
}

impl Serialize for TrainerFrame {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TrainerFrame::Message(m) => m.serialize(s),
            TrainerFrame::Challenge { nonce } => {
                let mut st = s.serialize_struct("TrainerFrame", 2)?;
                st.serialize_field(TAG, CHALLENGE)?;
                st.serialize_field("nonce", serde_bytes::Bytes::new(nonce))?;
                st.end()
            }
            TrainerFrame::Welcome(w) => {
                let mut st = s.serialize_struct("TrainerFrame", 7)?;
                st.serialize_field(TAG, WELCOME)?;
                st.serialize_field("node_index", &w.node_index)?;
                st.serialize_field("spec", &w.spec)?;
                st.serialize_field("weights", &w.weights)?;
                st.serialize_field("heartbeat_ms", &w.heartbeat_ms)?;
                st.serialize_field("heartbeat_timeout_ms", &w.heartbeat_timeout_ms)?;
                st.serialize_field("max_frame", &w.max_frame)?;
                st.end()
            }
            TrainerFrame::Reject { reason } => {
                let mut st = s.serialize_struct("TrainerFrame", 2)?;
                st.serialize_field(TAG, REJECT)?;
                st.serialize_field("reason", reason)?;
                st.end()
            }
            TrainerFrame::Heartbeat => heartbeat(s, "TrainerFrame"),
        }
    }
}

fn heartbeat<S: Serializer>(s: S, name: &'static str) -> Result<S::Ok, S::Error> {
    let mut st = s.serialize_struct(name, 1)?;
    st.serialize_field(TAG, HEARTBEAT)?;
    st.end()
}
