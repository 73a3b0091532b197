//! Why an ONNX model cannot serve as a policy; every error names the tensor or node.

#[cfg(feature = "onnx")]
use crate::peer_text::bounded_to as bounded;

/// What is wrong with an ONNX model or what it produced.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OnnxError {
    /// This build has no ONNX runtime: rollout was compiled without its cargo feature
    /// `onnx` (`rollout-actors`, the CLI and the Python module forward it).
    #[error(
        "this build cannot run ONNX policies: it was compiled without the cargo feature `onnx` \
         (enable `onnx` on rollout or rollout-actors)"
    )]
    NoRuntime,
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
    /// A node the checks made before tract sees the model refuse (a bound on the graph,
    /// or a constant shape over the budget).
    #[error("node `{node}` ({op}): {reason}")]
    Node {
        /// The node's name (or its first output's), bounded and escaped.
        node: String,
        /// Its op type, bounded and escaped.
        op: String,
        /// Why.
        reason: String,
    },
    /// The model as a whole is over a bound checked before it is decoded.
    #[error("{0}")]
    Bound(String),
    /// tract panicked on the model: caught, and the model refused.
    #[error("tract panicked while {doing}: {message}{}", if at.is_empty() { String::new() } else { format!(" (at {at})") })]
    Panicked {
        /// What was being done (parsing, typing, optimising, running).
        doing: String,
        /// The panic's message, bounded and escaped.
        message: String,
        /// Where in tract (file:line), when known.
        at: String,
    },
}

/// The most bytes of a name from the model an error shows.
#[cfg(feature = "onnx")]
pub(crate) const MAX_NAME_BYTES: usize = 256;

/// The most bytes of tract's error chain an error shows.
#[cfg(feature = "onnx")]
const MAX_TRACT_MESSAGE: usize = 1024;

/// Errors naming what the model holds, each name bounded and escaped.
#[cfg(feature = "onnx")]
impl OnnxError {
    /// A tract error with its whole context chain.
    pub(super) fn tract(e: impl std::fmt::Display) -> OnnxError {
        OnnxError::Tract(bounded(&format!("{e:#}"), MAX_TRACT_MESSAGE))
    }

    /// An initializer's (or a constant tensor's) error, its name bounded.
    pub(super) fn initializer(name: &str, reason: impl Into<String>) -> OnnxError {
        OnnxError::Initializer {
            name: bounded(name, MAX_NAME_BYTES),
            reason: reason.into(),
        }
    }

    /// A node's error, its name and op bounded.
    pub(super) fn node(node: &str, op: &str, reason: impl Into<String>) -> OnnxError {
        OnnxError::Node {
            node: bounded(node, MAX_NAME_BYTES),
            op: bounded(op, MAX_NAME_BYTES),
            reason: reason.into(),
        }
    }

    /// An output error.
    pub(super) fn output(name: &str, reason: impl Into<String>) -> OnnxError {
        OnnxError::Output {
            name: bounded(name, MAX_NAME_BYTES),
            reason: reason.into(),
        }
    }

    /// An input error.
    pub(super) fn input(name: &str, reason: impl Into<String>) -> OnnxError {
        OnnxError::Input {
            name: bounded(name, MAX_NAME_BYTES),
            reason: reason.into(),
        }
    }
}

#[cfg(all(test, feature = "onnx"))]
mod tests {
    use super::*;

    #[test]
    fn bounded_escapes_cuts_on_a_character_and_gives_the_size() {
        assert_eq!(bounded("fc1.weight", 256), "fc1.weight");
        assert_eq!(bounded("a\nb\u{1b}[31m", 256), "a\\nb\\u{1b}[31m");
        let long = "é".repeat(1000);
        let b = bounded(&long, 9);
        assert_eq!(b, "éééé … (2000 bytes)");
        // Escapes count toward the bound: a name of control characters stays short.
        let ctl = "\u{7}".repeat(100_000);
        let b = bounded(&ctl, MAX_NAME_BYTES);
        assert!(b.len() <= MAX_NAME_BYTES + 24, "{} bytes", b.len());
        assert!(!b.contains('\u{7}'));
        assert!(b.ends_with("(100000 bytes)"), "{b}");
    }
}
