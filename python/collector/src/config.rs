//! A collector's settings from the dict the Python `DistributedCollector` passes:
//! every key is a builder setting (torchrl's names where torchrl has one), every
//! value is checked for its type here and for its meaning by the builder, and a
//! bad one is a `ConfigError` naming the argument. An unknown key is refused, so
//! a misspelt argument never goes unnoticed.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rollout::checkpoint::Checkpoint;
use rollout::policy::OnnxHead;
use rollout::{EnvSpec, ExplorationType, PolicyConfig, PolicySpec};
use rollout_actors::{CollectorArgs, CollectorBuilder, Launcher, NodeOverrides, SlurmOptions};

use crate::errors::config_error;

/// The settings dict, read key by key; what is left at the end is unknown.
struct Settings<'py> {
    dict: Bound<'py, PyDict>,
}

impl<'py> Settings<'py> {
    /// Takes `key` out, `None` when absent or Python `None`.
    fn take<T: FromPyObject<'py>>(&self, key: &str, expected: &str) -> PyResult<Option<T>> {
        let Some(v) = self.dict.get_item(key)? else {
            return Ok(None);
        };
        self.dict.del_item(key)?;
        if v.is_none() {
            return Ok(None);
        }
        v.extract()
            .map(Some)
            .map_err(|_| config_error(key, format!("expected {expected}, got {}", type_name(&v))))
    }

    /// The first key left, which no setting took.
    fn unknown(&self) -> Option<String> {
        self.dict.keys().iter().next().map(|k| k.to_string())
    }
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The policy of `json` (a config dict as JSON); `policy="onnx"` reads `policy_file`
/// now, with `onnx_head`, so a bad model is refused before any node starts.
fn policy_config(json: &str, policy_file: Option<PathBuf>, onnx_head: Option<String>) -> PyResult<PolicyConfig> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| config_error("policy", format!("not a policy config: {e}")))?;
    if value.get("kind").and_then(|k| k.as_str()) != Some("onnx") {
        if policy_file.is_some() {
            return Err(config_error("policy_file", "only used with policy=\"onnx\""));
        }
        if onnx_head.is_some() {
            return Err(config_error("onnx_head", "only used with policy=\"onnx\""));
        }
        return serde_json::from_value::<PolicyConfig>(value)
            .map_err(|e| config_error("policy", format!("not a policy config: {e}")));
    }
    let path = policy_file.ok_or_else(|| config_error("policy_file", "required by policy=\"onnx\": the .onnx file"))?;
    let name = onnx_head.ok_or_else(|| {
        config_error(
            "onnx_head",
            "required by policy=\"onnx\": categorical, normal, tanh_normal, deterministic or qvalue",
        )
    })?;
    let head = OnnxHead::from_name(&name).ok_or_else(|| {
        config_error(
            "onnx_head",
            format!("{name:?} is not one of categorical, normal, tanh_normal, deterministic, qvalue"),
        )
    })?;
    let mut config =
        rollout_actors::policy_file::onnx_policy(&path, head).map_err(|e| config_error("policy_file", e))?;
    // An exploration module the nodes run after the model (PROTOCOL.md §8): its config and
    // the whole state list (the model's, then the module's), as the exporter wrote them.
    if let (Some(module), PolicyConfig::Onnx { state, exploration, .. }) = (value.get("exploration"), &mut config) {
        *exploration = Some(
            serde_json::from_value(module.clone())
                .map_err(|e| config_error("policy", format!("not an exploration module: {e}")))?,
        );
        let listed = value
            .get("state")
            .ok_or_else(|| config_error("policy", "an exploration module needs the state list"))?;
        *state = serde_json::from_value(listed.clone())
            .map_err(|e| config_error("policy", format!("not a state list: {e}")))?;
    }
    Ok(config)
}

/// An exploration type by torchrl's names (`random`, `deterministic`, `mode`, `mean`).
fn exploration(field: &str, s: &str) -> PyResult<ExplorationType> {
    ExplorationType::from_name(s)
        .ok_or_else(|| config_error(field, format!("{s:?} is not one of random, deterministic, mode, mean")))
}

/// An env spec from a name and an optional JSON config.
fn env_spec(field: &str, name: String, config: Option<String>) -> PyResult<EnvSpec> {
    let spec = EnvSpec::new(name);
    Ok(match config {
        None => spec,
        Some(json) => spec.with_config(
            serde_json::from_str(&json).map_err(|e| config_error(field, format!("not a JSON config: {e}")))?,
        ),
    })
}

/// The per-node overrides (torchrl's per-collector `collector_kwargs`): one dict per node.
fn node_overrides(list: &Bound<'_, PyList>) -> PyResult<Vec<NodeOverrides>> {
    const FIELD: &str = "collector_kwargs";
    let mut out = Vec::with_capacity(list.len());
    for item in list.iter() {
        let dict = item
            .downcast::<PyDict>()
            .map_err(|_| config_error(FIELD, "expected one dict per node"))?
            .copy()?;
        let s = Settings { dict };
        let env_config = s.take::<String>("env_config", "a JSON string")?;
        let env = match s.take::<String>("env", "an env name")? {
            Some(name) => Some(env_spec(FIELD, name, env_config)?),
            None if env_config.is_some() => return Err(config_error(FIELD, "env_config needs env")),
            None => None,
        };
        let envs_per_node = s.take::<usize>("envs_per_node", "a positive integer")?;
        let exploration_type = match s.take::<String>("exploration_type", "a string")? {
            Some(e) => Some(exploration(FIELD, &e)?),
            None => None,
        };
        if let Some(k) = s.unknown() {
            return Err(config_error(FIELD, format!("unknown per-node setting {k:?}")));
        }
        out.push(NodeOverrides {
            env,
            envs_per_node,
            exploration_type,
        });
    }
    Ok(out)
}

/// `slurm_kwargs`: the `Slurm` launcher's options.
fn slurm_options(dict: Bound<'_, PyDict>) -> PyResult<SlurmOptions> {
    const FIELD: &str = "slurm_kwargs";
    let s = Settings { dict };
    let mut o = SlurmOptions {
        partition: s.take("partition", "a string")?,
        time: s.take("time", "a string")?,
        cpus_per_task: s.take("cpus_per_task", "an integer")?,
        mem: s.take("mem", "a string")?,
        ..SlurmOptions::default()
    };
    if let Some(lines) = s.take("extra_lines", "a list of strings")? {
        o.extra_lines = lines;
    }
    if let Some(name) = s.take("job_name", "a string")? {
        o.job_name = name;
    }
    if let Some(dir) = s.take::<PathBuf>("output_dir", "a path")? {
        o.output_dir = dir;
    }
    if let Some(k) = s.unknown() {
        return Err(config_error(FIELD, format!("unknown SLURM option {k:?}")));
    }
    Ok(o)
}

/// Decodes checkpoint bytes as `resume` would, so that `load_state_dict` refuses
/// garbage (a `ConfigError` on `resume`) before it stops the run it has.
#[pyfunction]
pub(crate) fn check_checkpoint(py: Python<'_>, checkpoint: Vec<u8>) -> PyResult<()> {
    py.allow_threads(|| Checkpoint::from_bytes(&checkpoint).map(drop))
        .map_err(|e| config_error("resume", e))
}

/// The builder for these settings (the dict is consumed): what Python spells its own
/// way (the policy, the launcher and its options, per-node overrides, the token, the
/// node command, a checkpoint) taken out here, the rest read as [`CollectorArgs`].
pub(crate) fn builder(dict: Bound<'_, PyDict>) -> PyResult<CollectorBuilder> {
    let s = Settings { dict };
    let mut b = CollectorBuilder::default();

    let mut policy = PolicySpec::default();
    let policy_file = s.take::<PathBuf>("policy_file", "a path")?;
    let onnx_head = s.take::<String>("onnx_head", "a string")?;
    if let Some(json) = s.take::<String>("policy", "a JSON policy config")? {
        policy.config = policy_config(&json, policy_file, onnx_head)?;
    } else if policy_file.is_some() || onnx_head.is_some() {
        return Err(config_error("policy_file", "only used with policy=\"onnx\""));
    }
    if let Some(seed) = s.take("policy_init_seed", "an integer")? {
        policy.init_seed = seed;
    }
    b = b.policy(policy);
    if let Some(list) = s.take::<Bound<'_, PyList>>("collector_kwargs", "a list of dicts, one per node")? {
        b = b.node_configs(node_overrides(&list)?);
    }

    let slurm = s.take::<Bound<'_, PyDict>>("slurm_kwargs", "a dict")?;
    let launcher = s.take::<String>("launcher", "one of local, process, external, slurm")?;
    let launcher = match (launcher.as_deref().unwrap_or("local"), slurm) {
        ("local", None) => Launcher::Local,
        ("process", None) => Launcher::Process,
        ("external", None) => Launcher::External,
        ("slurm", o) => Launcher::Slurm(match o {
            Some(d) => slurm_options(d.copy()?)?,
            None => SlurmOptions::default(),
        }),
        (_, Some(_)) => return Err(config_error("slurm_kwargs", "only with launcher=\"slurm\"")),
        (other, _) => {
            return Err(config_error(
                "launcher",
                format!("{other:?} is not one of local, process, external, slurm"),
            ))
        }
    };
    b = b.launcher(launcher);
    if let Some(v) = s.take::<Vec<u8>>("token", "bytes")? {
        b = b.token(v);
    }
    if let Some(argv) = s.take::<Vec<String>>("node_command", "a list of strings: the program, then its arguments")? {
        b = b.node_command(argv);
    }
    if let Some(bytes) = s.take::<Vec<u8>>("resume", "checkpoint bytes (state_dict()[\"checkpoint\"])")? {
        let c = Checkpoint::from_bytes(&bytes).map_err(|e| config_error("resume", e))?;
        b = b.resume(c);
    }
    if s.dict.get_item("env")?.is_none_or(|v| v.is_none()) {
        return Err(config_error("env", "required: the name of a registered env"));
    }
    collector_args(&s.dict)?
        .apply(b)
        .map_err(|e| config_error(e.field, e.reason))
}

/// The plain settings of `dict` (every key the front end did not take), each value
/// read as JSON would give it: a bool is a bool (not anything truthy), a number a
/// number; a value of the wrong type, or a key no setting has, names its key.
fn collector_args(dict: &Bound<'_, PyDict>) -> PyResult<CollectorArgs> {
    let mut map = serde_json::Map::new();
    for (k, v) in dict.iter() {
        let key: String = k
            .extract()
            .map_err(|_| config_error("settings", "keys must be strings"))?;
        let value = json_value(&v).map_err(|why| config_error(&key, why))?;
        map.insert(key, value);
    }
    serde_path_to_error::deserialize::<_, CollectorArgs>(serde_json::Value::Object(map)).map_err(|e| {
        let field = e.path().to_string();
        let reason = e.into_inner().to_string();
        if reason.starts_with("unknown field") {
            config_error(&field, "unknown argument")
        } else {
            config_error(&field, in_python_words(&reason))
        }
    })
}

/// serde's "invalid type: string \"x\", expected usize" as "expected a non-negative
/// integer, got string \"x\""; any other message as it is.
fn in_python_words(reason: &str) -> String {
    let Some(rest) = reason
        .strip_prefix("invalid type: ")
        .or_else(|| reason.strip_prefix("invalid value: "))
    else {
        return reason.to_string();
    };
    let Some((got, want)) = rest.split_once(", expected ") else {
        return reason.to_string();
    };
    let want = match want {
        "usize" | "u64" | "u32" => "a non-negative integer",
        "i64" | "i32" => "an integer",
        other => other,
    };
    format!("expected {want}, got {got}")
}

/// A Python value as JSON: None, bool, int, float (finite), str, and lists and dicts of
/// them; anything else is refused with its type's name.
fn json_value(v: &Bound<'_, PyAny>) -> Result<serde_json::Value, String> {
    use pyo3::types::{PyBool, PyFloat, PyInt, PyString, PyTuple};
    use serde_json::Value;
    if v.is_none() {
        Ok(Value::Null)
    } else if let Ok(b) = v.downcast::<PyBool>() {
        Ok(Value::Bool(b.is_true()))
    } else if v.is_instance_of::<PyInt>() {
        if let Ok(n) = v.extract::<u64>() {
            Ok(n.into())
        } else if let Ok(n) = v.extract::<i64>() {
            Ok(n.into())
        } else {
            Err("an integer too large for a setting".into())
        }
    } else if let Ok(f) = v.downcast::<PyFloat>() {
        serde_json::Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| format!("{} is not a finite number", f.value()))
    } else if let Ok(s) = v.downcast::<PyString>() {
        Ok(Value::String(s.to_cow().map_err(|e| e.to_string())?.into_owned()))
    } else if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        v.try_iter()
            .map_err(|e| e.to_string())?
            .map(|item| item.map_err(|e| e.to_string()).and_then(|i| json_value(&i)))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array)
    } else {
        Err(format!("unexpected {}", type_name(v)))
    }
}
