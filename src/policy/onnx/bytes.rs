//! The model file as configs and `welcome` carry it: shared, never copied per clone.

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The bytes of an `.onnx` file behind an `Arc`; serialised as one msgpack `bin`.
/// Its `Debug` shows the size only.
#[derive(Clone, PartialEq, Eq)]
pub struct OnnxBytes(Arc<[u8]>);

impl OnnxBytes {
    /// The file's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No bytes at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<u8>> for OnnxBytes {
    fn from(v: Vec<u8>) -> OnnxBytes {
        OnnxBytes(v.into())
    }
}

impl From<&[u8]> for OnnxBytes {
    fn from(v: &[u8]) -> OnnxBytes {
        OnnxBytes(v.into())
    }
}

impl std::fmt::Debug for OnnxBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OnnxBytes({} bytes)", self.0.len())
    }
}

impl Serialize for OnnxBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_bytes::serialize(&*self.0, s)
    }
}

impl<'de> Deserialize<'de> for OnnxBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<OnnxBytes, D::Error> {
        let v: serde_bytes::ByteBuf = serde_bytes::ByteBuf::deserialize(d)?;
        Ok(OnnxBytes(v.into_vec().into()))
    }
}
