//! The spaces of a built-in env, known without starting a run: the torch side
//! (`rollout._torch`) exports a policy for them (an example observation of the
//! right shape, the action's bounds) before any node exists.

use pyo3::prelude::*;
use rollout::space::EnvSpecs;
use rollout::{EnvSpec, Registry};

use crate::errors::config_error;

/// The specs (PROTOCOL.md §3's JSON, `{"observation": ..., "action": ...}`) of the
/// built-in env `name` made with the JSON `config`, or `None` when no built-in env has
/// that name (the nodes may still have it). A config the env refuses is a
/// `ConfigError` on `env_config`.
#[pyfunction]
#[pyo3(signature = (name, config=None))]
pub(crate) fn builtin_env_specs(name: &str, config: Option<String>) -> PyResult<Option<String>> {
    let registry = Registry::with_builtins();
    if !registry.contains(name) {
        return Ok(None);
    }
    let mut spec = EnvSpec::new(name);
    if let Some(json) = config {
        let value =
            serde_json::from_str(&json).map_err(|e| config_error("env_config", format!("not a JSON config: {e}")))?;
        spec = spec.with_config(value);
    }
    let env = registry.make(&spec).map_err(|e| config_error("env_config", e))?;
    let specs = EnvSpecs::from_specs(env.observation_spec(), env.action_spec());
    serde_json::to_string(&specs)
        .map(Some)
        .map_err(|e| config_error("env", format!("specs not serialisable: {e}")))
}
