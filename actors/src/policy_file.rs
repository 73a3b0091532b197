//! The `onnx` policy of a model file a user names (`--policy-file`, `policy_file=`):
//! read as bounded input ([`crate::bounded_file`]), then parsed once, before any node
//! starts. Parsing needs the cargo feature `onnx`: without it the model is refused
//! with [`OnnxError::NoRuntime`], which names the feature.

use std::path::Path;

use rollout::policy::{OnnxError, OnnxHead, OnnxModel};
use rollout::PolicyConfig;

use crate::bounded_file::{read_bounded, shown, FileError, POLICY_FILE};

/// Why a policy file gave no policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    /// The file was not read: not a regular file, over
    /// [`MAX_MODEL_BYTES`](rollout::policy::MAX_MODEL_BYTES), or unreadable.
    #[error(transparent)]
    File(#[from] FileError),
    /// Its bytes are not a model rollout can run.
    #[error("{path}: {source}")]
    Onnx {
        /// The file (control characters escaped).
        path: String,
        /// Why.
        source: OnnxError,
    },
}

/// The `onnx` policy of the model in file `path` with the given head: the file read
/// (a regular file of at most [`MAX_MODEL_BYTES`](rollout::policy::MAX_MODEL_BYTES))
/// and parsed now; the fit to the env's specs is checked when the policy is built for
/// them. A recurrent model (one with an `is_init` input) gets the state its inputs
/// declare ([`OnnxModel::declared_state`]).
pub fn onnx_policy(path: &Path, head: OnnxHead) -> Result<PolicyConfig, PolicyFileError> {
    let bytes = read_bounded(path, POLICY_FILE)?;
    let onnx = |source| PolicyFileError::Onnx {
        path: shown(path),
        source,
    };
    let model = OnnxModel::parse(bytes).map_err(onnx)?;
    let state = model.declared_state().map_err(onnx)?;
    Ok(PolicyConfig::Onnx {
        model,
        head,
        state,
        exploration: None,
    })
}

/// A build without the feature `onnx`: an `onnx` policy still decodes, and every
/// use of it is refused with an error that names the feature. (The workspace's
/// suites turn the feature on; `cargo nextest run -p rollout-actors` runs these.)
#[cfg(all(test, not(feature = "onnx")))]
mod without_onnx_tests {
    use rollout::policy::PolicyError;
    use rollout::{PolicySpec, Spec};

    use super::*;

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx/cartpole_categorical.onnx")
    }

    #[test]
    fn a_policy_file_is_refused_naming_the_feature() {
        let e = onnx_policy(&fixture(), OnnxHead::Categorical).unwrap_err();
        assert!(
            matches!(
                e,
                PolicyFileError::Onnx {
                    source: OnnxError::NoRuntime,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("cargo feature `onnx`"), "{e}");
    }

    #[test]
    fn an_onnx_config_decodes_and_its_policy_is_refused_naming_the_feature() {
        let config = PolicyConfig::Onnx {
            model: OnnxModel::new(std::fs::read(fixture()).unwrap()),
            head: OnnxHead::Categorical,
            state: vec![],
            exploration: None,
        };
        let wire = rmp_serde::to_vec_named(&config).unwrap();
        let decoded: PolicyConfig = rmp_serde::from_slice(&wire).unwrap();
        assert_eq!(decoded, config);
        let obs = Spec::uniform_box(4, f32::NEG_INFINITY, f32::INFINITY);
        let e = PolicySpec::from(decoded)
            .build(&obs, &Spec::Discrete { n: 2 }, 0)
            .err()
            .expect("no ONNX runtime in this build");
        assert_eq!(e, PolicyError::Onnx(OnnxError::NoRuntime));
        assert!(e.to_string().contains("cargo feature `onnx`"), "{e}");
    }

    #[test]
    fn a_collector_of_an_onnx_policy_is_a_config_error_naming_the_feature() {
        let config = PolicyConfig::Onnx {
            model: OnnxModel::new(std::fs::read(fixture()).unwrap()),
            head: OnnxHead::Categorical,
            state: vec![],
            exploration: None,
        };
        let built = crate::CollectorBuilder::default()
            .env("CartPole-v1")
            .frames_per_batch(8)
            .nodes(1)
            .launcher(crate::Launcher::Local)
            .policy(config)
            .build();
        match built {
            Err(crate::CollectError::Config(e)) => {
                assert_eq!(e.field, "policy");
                assert!(e.reason.contains("cargo feature `onnx`"), "{}", e.reason);
            }
            Err(other) => panic!("expected a config error, got {other}"),
            Ok(_) => panic!("a collector of an onnx policy without the feature"),
        }
    }
}
