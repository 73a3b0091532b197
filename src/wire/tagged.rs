//! The two frame types on the wire: one map each, `type` naming the frame.
//!
//! A frame is either one of the wire's own (handshake, heartbeat) or a session
//! message (`ToNode`, `FromNode`) written exactly as that message serializes, so
//! the message types are the wire's vocabulary and no enum repeats their variants.
//!
//! Decoding reads the `type` first (every sender of this crate writes it first)
//! and hands the rest of the map straight to the frame it names, so a frame is
//! never buffered whole on the way: what a session message's own decoding does
//! with its fields is what happens. A `type` written anywhere else still decodes,
//! the same, through a buffer: the frame is read into an `rmpv::Value` first.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{MapAccessDeserializer, StrDeserializer};
use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{NodeFrame, TrainerFrame, Welcome};
use crate::message::{FromNode, ToNode};

/// The key naming a frame.
const TAG: &str = "type";
/// `type` of [`NodeFrame::Hello`].
pub(super) const HELLO: &str = "hello";
/// `type` of [`NodeFrame::Auth`].
pub(super) const AUTH: &str = "auth";
/// `type` of both directions' heartbeat.
pub(super) const HEARTBEAT: &str = "heartbeat";
/// `type` of [`TrainerFrame::Challenge`].
pub(super) const CHALLENGE: &str = "challenge";
/// `type` of [`TrainerFrame::Welcome`].
pub(super) const WELCOME: &str = "welcome";
/// `type` of [`TrainerFrame::Reject`].
pub(super) const REJECT: &str = "reject";

impl Serialize for NodeFrame {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            NodeFrame::Message(m) => m.serialize(s),
            NodeFrame::Hello {
                protocol_version,
                node_name,
                node_index,
            } => {
                let mut st = s.serialize_struct("NodeFrame", 4)?;
                st.serialize_field(TAG, HELLO)?;
                st.serialize_field("protocol_version", protocol_version)?;
                st.serialize_field("node_name", node_name)?;
                st.serialize_field("node_index", node_index)?;
                st.end()
            }
            NodeFrame::Auth { proof } => {
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

/// A frame type: its own frames by `type`, or else a session message.
trait Tagged: Sized {
    /// The session messages of this direction.
    type Message: DeserializeOwned;
    /// For errors: what was expected.
    const EXPECTING: &'static str;
    /// True if `tag` names one of the wire's own frames of this direction.
    fn own(tag: &str) -> bool;
    /// That frame, from its fields (`type` left out).
    fn own_frame<'de, D: Deserializer<'de>>(tag: &str, fields: D) -> Result<Self, D::Error>;
    /// A session message as a frame.
    fn message(m: Self::Message) -> Self;
}

/// The fields of `hello`.
#[derive(Deserialize)]
struct Hello {
    protocol_version: u32,
    node_name: String,
    #[serde(default)]
    node_index: Option<usize>,
}

/// The fields of `auth`.
#[derive(Deserialize)]
struct Auth {
    #[serde(with = "serde_bytes")]
    proof: Vec<u8>,
}

/// The (absent) fields of `heartbeat`: anything else is ignored.
#[derive(Deserialize)]
struct Empty {}

/// The fields of `challenge`.
#[derive(Deserialize)]
struct Challenge {
    #[serde(with = "serde_bytes")]
    nonce: Vec<u8>,
}

/// The fields of `reject`.
#[derive(Deserialize)]
struct Reject {
    reason: String,
}

impl Tagged for NodeFrame {
    type Message = FromNode;
    const EXPECTING: &'static str = "a node frame (a map with a `type`)";

    fn own(tag: &str) -> bool {
        [HELLO, AUTH, HEARTBEAT].contains(&tag)
    }

    fn own_frame<'de, D: Deserializer<'de>>(tag: &str, fields: D) -> Result<Self, D::Error> {
        Ok(match tag {
            HELLO => {
                let h = Hello::deserialize(fields)?;
                NodeFrame::Hello {
                    protocol_version: h.protocol_version,
                    node_name: h.node_name,
                    node_index: h.node_index,
                }
            }
            AUTH => NodeFrame::Auth {
                proof: Auth::deserialize(fields)?.proof,
            },
            _ => {
                Empty::deserialize(fields)?;
                NodeFrame::Heartbeat
            }
        })
    }

    fn message(m: FromNode) -> Self {
        NodeFrame::Message(m)
    }
}

impl Tagged for TrainerFrame {
    type Message = ToNode;
    const EXPECTING: &'static str = "a trainer frame (a map with a `type`)";

    fn own(tag: &str) -> bool {
        [CHALLENGE, WELCOME, REJECT, HEARTBEAT].contains(&tag)
    }

    fn own_frame<'de, D: Deserializer<'de>>(tag: &str, fields: D) -> Result<Self, D::Error> {
        Ok(match tag {
            CHALLENGE => TrainerFrame::Challenge {
                nonce: Challenge::deserialize(fields)?.nonce,
            },
            WELCOME => TrainerFrame::Welcome(Box::new(Welcome::deserialize(fields)?)),
            REJECT => TrainerFrame::Reject {
                reason: Reject::deserialize(fields)?.reason,
            },
            _ => {
                Empty::deserialize(fields)?;
                TrainerFrame::Heartbeat
            }
        })
    }

    fn message(m: ToNode) -> Self {
        TrainerFrame::Message(m)
    }
}

impl<'de> Deserialize<'de> for NodeFrame {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FrameVisitor(PhantomData))
    }
}

impl<'de> Deserialize<'de> for TrainerFrame {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FrameVisitor(PhantomData))
    }
}

struct FrameVisitor<F>(PhantomData<F>);

impl<'de, F: Tagged> Visitor<'de> for FrameVisitor<F> {
    type Value = F;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(F::EXPECTING)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<F, A::Error> {
        let Some(first) = map.next_key::<rmpv::Value>()? else {
            return Err(de::Error::missing_field(TAG));
        };
        if first.as_str() == Some(TAG) {
            let tag: rmpv::Value = map.next_value()?;
            return match tag.as_str() {
                Some(t) if F::own(t) => F::own_frame(t, MapAccessDeserializer::new(NoSecondTag(map))),
                // A frame's `type` is its name (PROTOCOL.md); serde's derive would also
                // take a variant's index, which would tie the wire to the enums' order.
                None => Err(de::Error::custom("`type` must be a string")),
                Some(_) => F::Message::deserialize(MapAccessDeserializer::new(TagPutBack {
                    tag: Some(tag),
                    rest: map,
                }))
                .map(F::message),
            };
        }
        // `type` is not first: buffer the frame, then decode it the same way.
        let mut entries = vec![(first, map.next_value::<rmpv::Value>()?)];
        while let Some(entry) = map.next_entry::<rmpv::Value, rmpv::Value>()? {
            entries.push(entry);
        }
        let tag = entries
            .iter()
            .position(|(k, _)| k.as_str() == Some(TAG))
            .ok_or_else(|| de::Error::missing_field(TAG))?;
        if !entries[tag].1.is_str() {
            return Err(de::Error::custom("`type` must be a string"));
        }
        let own = entries[tag].1.as_str().filter(|t| F::own(t)).map(str::to_owned);
        match own {
            Some(t) => {
                entries.remove(tag);
                if entries.iter().any(|(k, _)| k.as_str() == Some(TAG)) {
                    return Err(de::Error::duplicate_field(TAG));
                }
                reread(&rmpv::Value::Map(entries), |d| F::own_frame(&t, d))
            }
            None => reread(&rmpv::Value::Map(entries), |d| {
                F::Message::deserialize(d).map(F::message)
            }),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<F, A::Error> {
        // A derived tagged enum takes `[type, fields...]` too: so does this, buffered.
        let mut items = Vec::new();
        while let Some(v) = seq.next_element::<rmpv::Value>()? {
            items.push(v);
        }
        let own = items
            .first()
            .and_then(|t| t.as_str())
            .filter(|t| F::own(t))
            .map(str::to_owned);
        match own {
            Some(t) => reread(&rmpv::Value::Array(items.split_off(1)), |d| F::own_frame(&t, d)),
            None => reread(&rmpv::Value::Array(items), |d| {
                F::Message::deserialize(d).map(F::message)
            }),
        }
    }
}

/// The decoder a buffered frame is read back with.
type Reread<'a> = rmp_serde::Deserializer<rmp_serde::decode::ReadRefReader<'a, [u8]>>;

/// Decodes a buffered frame with `f` as if it had come so off the wire: written
/// back to MessagePack and read by the same decoder, so enums, bytes and the rest
/// decode exactly as they do unbuffered.
fn reread<T, E: de::Error>(
    v: &rmpv::Value,
    f: impl FnOnce(&mut Reread<'_>) -> Result<T, rmp_serde::decode::Error>,
) -> Result<T, E> {
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, v).map_err(de::Error::custom)?;
    f(&mut rmp_serde::Deserializer::from_read_ref(&bytes[..])).map_err(de::Error::custom)
}

/// A frame's map after its `type` was read: gives the `type` back first, then the
/// rest as it comes off the wire.
struct TagPutBack<A> {
    tag: Option<rmpv::Value>,
    rest: A,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for TagPutBack<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        if self.tag.is_some() {
            return seed.deserialize(StrDeserializer::<A::Error>::new(TAG)).map(Some);
        }
        self.rest.next_key_seed(seed)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        match self.tag.take() {
            Some(tag) => seed.deserialize(tag).map_err(de::Error::custom),
            None => self.rest.next_value_seed(seed),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.rest.size_hint().map(|n| n + usize::from(self.tag.is_some()))
    }
}

/// The fields of one of the wire's own frames after its `type`: refuses a second
/// `type`, as a derived tagged enum does.
struct NoSecondTag<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for NoSecondTag<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        // Keys of these frames are a few short strings: reading each one first costs nothing.
        let Some(key) = self.0.next_key::<rmpv::Value>()? else {
            return Ok(None);
        };
        if key.as_str() == Some(TAG) {
            return Err(de::Error::duplicate_field(TAG));
        }
        seed.deserialize(key).map(Some).map_err(de::Error::custom)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.0.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}
