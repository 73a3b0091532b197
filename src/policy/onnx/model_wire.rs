//! How an [`OnnxModel`] travels and prints, the same with or without the `onnx`
//! feature: its file's bytes, as they are (so a build without tract still reads an
//! `onnx` config from the wire or a checkpoint, and refuses it only when it is used).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{OnnxBytes, OnnxModel};

impl std::fmt::Debug for OnnxModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OnnxModel({} bytes)", self.bytes().len())
    }
}

impl Serialize for OnnxModel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.bytes().serialize(s)
    }
}

impl<'de> Deserialize<'de> for OnnxModel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<OnnxModel, D::Error> {
        OnnxBytes::deserialize(d).map(OnnxModel::new)
    }
}
