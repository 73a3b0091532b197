//! [`OnnxModel`] in a build without the cargo feature `onnx`: the file is carried as
//! it travels (configs, checkpoints and `welcome` decode and encode unchanged), and
//! every use that needs tract is [`OnnxError::NoRuntime`], which names the feature.

use std::sync::Arc;

use super::{OnnxBytes, OnnxError, OnnxHead};
use crate::policy::{StateTensor, Weights};
use crate::schema::BatchLayout;
use crate::spec::Spec;

/// An `.onnx` file this build cannot run (no feature `onnx`). Serialised as its
/// bytes; two models are equal when their bytes are.
#[derive(Clone, PartialEq)]
pub struct OnnxModel {
    bytes: OnnxBytes,
}

impl OnnxModel {
    /// The model in `bytes`, kept as they are.
    pub fn new(bytes: impl Into<OnnxBytes>) -> OnnxModel {
        OnnxModel { bytes: bytes.into() }
    }

    /// Always [`OnnxError::NoRuntime`]: parsing needs tract.
    pub fn parse(bytes: impl Into<OnnxBytes>) -> Result<OnnxModel, OnnxError> {
        let _ = bytes.into();
        Err(OnnxError::NoRuntime)
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &OnnxBytes {
        &self.bytes
    }

    /// Always [`OnnxError::NoRuntime`]: the weights are read by parsing the model.
    pub fn initial_weights(&self) -> Result<Arc<Weights>, OnnxError> {
        Err(OnnxError::NoRuntime)
    }

    /// Always [`OnnxError::NoRuntime`].
    pub fn check(&self, obs: &Spec, action: &Spec, head: OnnxHead, state: &[StateTensor]) -> Result<(), OnnxError> {
        let _ = (obs, action, head, state);
        Err(OnnxError::NoRuntime)
    }

    /// Always [`OnnxError::NoRuntime`]: the inputs are read by parsing the model.
    pub fn declared_state(&self) -> Result<Vec<StateTensor>, OnnxError> {
        Err(OnnxError::NoRuntime)
    }

    /// Always [`OnnxError::NoRuntime`].
    pub fn check_node_specs(
        &self,
        layout: &BatchLayout,
        action: &Spec,
        head: OnnxHead,
        state: &[StateTensor],
    ) -> Result<(), OnnxError> {
        let _ = (layout, action, head, state);
        Err(OnnxError::NoRuntime)
    }
}
