//! The strict decoder of the frames a node sends before it is admitted (`hello`,
//! `auth`): the trainer reads these from anyone who can reach its port, so this
//! path costs no more than the bytes of the frame.
//!
//! It reads the MessagePack by hand, field by field, into the few scalars these
//! frames hold: no serde tagged enum, no `rmpv::Value`, nothing buffered for a
//! key it does not know (an unknown value is skipped, iteratively, without being
//! built). Frames are at most [`LOGIN_MAX_FRAME`](super::LOGIN_MAX_FRAME) bytes
//! here, so every allocation is bounded by that. Stricter than the session's
//! decoder, as PROTOCOL.md §4 says: an unknown field, a key given twice or bytes
//! after the value refuse the frame.

use super::cursor::Cursor;
use super::{Auth, Hello, WireError};
use crate::message::names;
use crate::peer_text::Bounded;

/// The `type` of the wire's own frames a node may send; with [`names::FROM_NODE`],
/// every frame a node may send, so a frame of the wrong kind is named in the refusal
/// ("expected hello, got batch") rather than called malformed.
const NODE_OWN_TYPES: &[&str] = &[names::HELLO, names::AUTH, names::HEARTBEAT];

/// Longest key or `type` read: every key of these frames is a short name.
const MAX_KEY: usize = 64;

/// A frame a node sent before login, decoded strictly: `hello` and `auth` as the
/// session's [`NodeFrame`](super::NodeFrame) holds them.
#[derive(Clone, Debug, PartialEq)]
pub enum LoginFrame {
    /// `hello`.
    Hello(Hello),
    /// `auth`.
    Auth(Auth),
    /// Another node frame (its `type`), well formed as a map of a known type; its
    /// fields were skipped, not read.
    Other(&'static str),
}

/// Decodes a frame body a node sent before `welcome`; see the module doc.
pub fn decode_login(body: &[u8]) -> Result<LoginFrame, WireError> {
    if body.is_empty() {
        return Err(WireError::Empty);
    }
    let mut r = Cursor::new(body);
    let fields = read_fields(&mut r).map_err(WireError::Decode)?;
    if !r.is_empty() {
        return Err(WireError::Decode(format!("{} bytes after the frame's value", r.left())));
    }
    fields.into_frame().map_err(WireError::Decode)
}

/// The fields seen in a login frame's map.
#[derive(Default)]
struct Fields {
    tag: Option<String>,
    protocol_version: Option<u64>,
    node_name: Option<String>,
    node_index: Option<Option<u64>>,
    proof: Option<Vec<u8>>,
    /// The first key this decoder does not know.
    unknown: Option<String>,
}

fn read_fields(r: &mut Cursor<'_>) -> Result<Fields, String> {
    let n = r.frame_len()?;
    let mut f = Fields::default();
    for _ in 0..n {
        let key = r.str(MAX_KEY).map_err(|e| format!("a key: {e}"))?;
        let dup = || format!("duplicate field `{key}`");
        match key.as_str() {
            names::TYPE => {
                let v = r
                    .str(MAX_KEY)
                    .map_err(|e| format!("`type` must be a short string ({e})"))?;
                if f.tag.replace(v).is_some() {
                    return Err(dup());
                }
            }
            "protocol_version" => {
                let v = r.uint().map_err(|e| format!("`protocol_version`: {e}"))?;
                if f.protocol_version.replace(v).is_some() {
                    return Err(dup());
                }
            }
            "node_name" => {
                let v = r.str(usize::MAX).map_err(|e| format!("`node_name`: {e}"))?;
                if f.node_name.replace(v).is_some() {
                    return Err(dup());
                }
            }
            "node_index" => {
                let v = if r.peek()? == NIL {
                    r.byte()?;
                    None
                } else {
                    Some(r.uint().map_err(|e| format!("`node_index`: {e}"))?)
                };
                if f.node_index.replace(v).is_some() {
                    return Err(dup());
                }
            }
            "proof" => {
                let v = r.bin().map(<[u8]>::to_vec).map_err(|e| format!("`proof`: {e}"))?;
                if f.proof.replace(v).is_some() {
                    return Err(dup());
                }
            }
            _ => {
                r.skip_value()?;
                f.unknown.get_or_insert(key);
            }
        }
    }
    Ok(f)
}

impl Fields {
    fn into_frame(self) -> Result<LoginFrame, String> {
        let tag = self.tag.ok_or("missing field `type`")?;
        let name = match tag.as_str() {
            names::HELLO => names::HELLO,
            names::AUTH => names::AUTH,
            other => {
                return NODE_OWN_TYPES
                    .iter()
                    .chain(names::FROM_NODE)
                    .find(|t| **t == other)
                    .map(|t| LoginFrame::Other(t))
                    .ok_or_else(|| format!("unknown frame type `{}`", Bounded(other)))
            }
        };
        let stray = |field: &str| format!("unknown field `{}` in {name}", Bounded(field));
        if let Some(k) = self.unknown {
            return Err(stray(&k));
        }
        if name == names::HELLO {
            if self.proof.is_some() {
                return Err(stray("proof"));
            }
            let v = self.protocol_version.ok_or("missing field `protocol_version`")?;
            let node_index = match self.node_index.flatten() {
                None => None,
                Some(i) => Some(usize::try_from(i).map_err(|_| format!("`node_index` {i} out of range"))?),
            };
            Ok(LoginFrame::Hello(Hello {
                // A version past u32 is not this protocol's either: refused as such.
                protocol_version: u32::try_from(v).unwrap_or(u32::MAX),
                node_name: self.node_name.ok_or("missing field `node_name`")?,
                node_index,
            }))
        } else {
            for (present, field) in [
                (self.protocol_version.is_some(), "protocol_version"),
                (self.node_name.is_some(), "node_name"),
                (self.node_index.is_some(), "node_index"),
            ] {
                if present {
                    return Err(stray(field));
                }
            }
            Ok(LoginFrame::Auth(Auth {
                proof: self.proof.ok_or("missing field `proof`")?,
            }))
        }
    }
}

const NIL: u8 = 0xc0;

/// The reads of these frames that own what they read (the rest is [`Cursor`]'s).
trait LoginReads {
    /// A `str` of at most `max` bytes, valid UTF-8.
    fn str(&mut self, max: usize) -> Result<String, String>;
}

impl LoginReads for Cursor<'_> {
    fn str(&mut self, max: usize) -> Result<String, String> {
        let bytes = self.str_bytes(max as u64)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| "a string that is not UTF-8".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{encode, NodeFrame, PROTOCOL_VERSION};

    fn body(f: &NodeFrame) -> Vec<u8> {
        encode(f, usize::MAX).unwrap()[crate::wire::PREFIX_LEN..].to_vec()
    }

    fn hello() -> NodeFrame {
        NodeFrame::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            node_name: "n0".into(),
            node_index: Some(1),
        })
    }

    fn value(v: rmpv::Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &v).unwrap();
        out
    }

    fn map(entries: &[(&str, rmpv::Value)]) -> Vec<u8> {
        value(rmpv::Value::Map(
            entries.iter().map(|(k, v)| ((*k).into(), v.clone())).collect(),
        ))
    }

    fn refused(body: &[u8], needle: &str) {
        match decode_login(body) {
            Err(e) => assert!(e.to_string().contains(needle), "{e} lacks {needle:?}"),
            Ok(f) => panic!("{f:?} decoded; expected a refusal with {needle:?}"),
        }
    }

    #[test]
    fn the_reference_hello_and_auth_decode_in_any_key_order() {
        assert_eq!(
            decode_login(&body(&hello())),
            Ok(LoginFrame::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                node_name: "n0".into(),
                node_index: Some(1),
            }))
        );
        assert_eq!(
            decode_login(&body(&NodeFrame::Auth(Auth { proof: vec![7; 32] }))),
            Ok(LoginFrame::Auth(Auth { proof: vec![7; 32] }))
        );
        let reordered = map(&[
            ("node_name", "n".into()),
            ("protocol_version", rmpv::Value::from(u64::from(PROTOCOL_VERSION))),
            ("type", "hello".into()),
        ]);
        assert_eq!(
            decode_login(&reordered),
            Ok(LoginFrame::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                node_name: "n".into(),
                node_index: None,
            }))
        );
        assert_eq!(
            decode_login(&body(&NodeFrame::Heartbeat)),
            Ok(LoginFrame::Other("heartbeat"))
        );
    }

    #[test]
    fn unknown_fields_duplicates_and_trailing_bytes_are_refused() {
        let v = || rmpv::Value::from(3u64);
        refused(
            &map(&[
                ("type", "hello".into()),
                ("protocol_version", v()),
                ("node_name", "n".into()),
                ("x", rmpv::Value::Array(vec![rmpv::Value::Nil; 100])),
            ]),
            "unknown field `x` in hello",
        );
        refused(
            &map(&[("type", "hello".into()), ("type", "hello".into())]),
            "duplicate field `type`",
        );
        refused(
            &map(&[
                ("type", "auth".into()),
                ("proof", rmpv::Value::Binary(vec![1])),
                ("proof", rmpv::Value::Binary(vec![1])),
            ]),
            "duplicate field `proof`",
        );
        refused(
            &map(&[
                ("type", "auth".into()),
                ("proof", rmpv::Value::Binary(vec![1])),
                ("node_name", "n".into()),
            ]),
            "unknown field `node_name` in auth",
        );
        let mut trailing = body(&hello());
        trailing.push(0xc0);
        refused(&trailing, "1 bytes after");
        refused(&map(&[("type", "challenge".into())]), "unknown frame type `challenge`");
        refused(&map(&[("protocol_version", v())]), "missing field `type`");
        refused(
            &map(&[("type", "auth".into()), ("proof", "not bin".into())]),
            "`proof`: expected bin",
        );
        refused(
            &map(&[
                ("type", "hello".into()),
                ("protocol_version", rmpv::Value::from(-1)),
                ("node_name", "n".into()),
            ]),
            "non-negative",
        );
        refused(&value(rmpv::Value::Array(vec!["hello".into()])), "must be a map");
        refused(&[0xc1], "must be a map");
        refused(&[], "empty");
    }

    #[test]
    fn lying_lengths_and_deep_nesting_cost_nothing() {
        // A map claiming 2^32-1 entries, an array claiming 2^32-1 nils, in a few bytes.
        refused(&[0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, b'x'], "cut short");
        let mut b = vec![0x81, 0xa1, b'x', 0xdd, 0xff, 0xff, 0xff, 0xff];
        b.extend([0xc0; 16]);
        refused(&b, "cut short");
        // Ten thousand nested arrays: skipped without recursion, then refused as unknown.
        let mut deep = vec![
            0x82, 0xa4, b't', b'y', b'p', b'e', 0xa5, b'h', b'e', b'l', b'l', b'o', 0xa1, b'x',
        ];
        deep.extend(std::iter::repeat_n(0x91, 10_000));
        deep.push(0xc0);
        refused(&deep, "unknown field `x`");
    }
}
