//! Why an ONNX model cannot serve as a policy; every error names the tensor or node.

/// What is wrong with an ONNX model or what it produced.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OnnxError {
    /// The bytes are not an ONNX model.
    #[error("not an ONNX model: {0}")]
    NotOnnx(String),
    /// The model is over [`MAX_MODEL_BYTES`](super::MAX_MODEL_BYTES).
    #[error("ONNX model of {size} bytes is over the limit of {limit} bytes")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A node whose op tract cannot run.
    #[error("node `{node}`: op `{op}` is not supported by tract")]
    UnsupportedOp {
        /// The node's name (or its first output's).
        node: String,
        /// The op type, with its domain when not the default one.
        op: String,
    },
    /// The observation input is missing or does not fit the observation spec.
    #[error("input `{name}`: {reason}")]
    Input {
        /// The input's name.
        name: String,
        /// Why it does not fit.
        reason: String,
    },
    /// An output the head needs is missing, or does not fit the action spec, or
    /// produced values the head cannot use.
    #[error("output `{name}`: {reason}")]
    Output {
        /// The output's name.
        name: String,
        /// Why it does not fit.
        reason: String,
    },
    /// An initializer that cannot be read or updated.
    #[error("initializer `{name}`: {reason}")]
    Initializer {
        /// Its name.
        name: String,
        /// Why.
        reason: String,
    },
    /// tract could not type, optimise or run the model.
    #[error("tract cannot run the model: {0}")]
    Tract(String),
}

impl OnnxError {
    /// A tract error with its whole context chain.
    pub(super) fn tract(e: impl std::fmt::Display) -> OnnxError {
        OnnxError::Tract(format!("{e:#}"))
    }

    /// An output error.
    pub(super) fn output(name: &str, reason: impl Into<String>) -> OnnxError {
        OnnxError::Output {
            name: name.to_string(),
            reason: reason.into(),
        }
    }

    /// An input error.
    pub(super) fn input(name: &str, reason: impl Into<String>) -> OnnxError {
        OnnxError::Input {
            name: name.to_string(),
            reason: reason.into(),
        }
    }
}
