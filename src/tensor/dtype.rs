//! The element types a tensor can hold, and their wire names and sizes.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Element type of a [`Tensor`](super::Tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 64-bit signed integer.
    I64,
    /// Boolean, one byte per element (0 or 1) when encoded.
    Bool,
    /// Unsigned byte.
    U8,
}

impl DType {
    /// Bytes per element in the encoded form.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool | DType::U8 => 1,
        }
    }

    /// The name used on the wire (`"f32"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::U8 => "u8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
