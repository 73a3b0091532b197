//! A collector's settings from the dict the Python `DistributedCollector` passes:
//! every key is a builder setting (torchrl's names where torchrl has one), every
//! value is checked for its type here and for its meaning by the builder, and a
//! bad one is a `ConfigError` naming the argument. An unknown key is refused, so
//! a misspelt argument never goes unnoticed.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rollout::checkpoint::Checkpoint;
use rollout::policy::OnnxHead;
use rollout::{EnvSpec, ExplorationType, PolicyConfig, PolicySpec};
use rollout_actors::{CollectorBuilder, Launcher, NodeOverrides, SlurmOptions};

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

    /// A duration in seconds.
    fn seconds(&self, key: &str) -> PyResult<Option<Duration>> {
        match self.take::<f64>(key, "a number of seconds")? {
            None => Ok(None),
            Some(s) => Duration::try_from_secs_f64(s)
                .map(Some)
                .map_err(|_| config_error(key, format!("{s} is not a duration in seconds"))),
        }
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
            "required by policy=\"onnx\": categorical, normal, tanh_normal or deterministic",
        )
    })?;
    let head = OnnxHead::from_name(&name).ok_or_else(|| {
        config_error(
            "onnx_head",
            format!("{name:?} is not one of categorical, normal, tanh_normal, deterministic"),
        )
    })?;
    rollout_actors::policy_file::onnx_policy(&path, head).map_err(|e| config_error("policy_file", e))
}

/// An exploration type by torchrl's names (`random`, `deterministic`, `mode`, `mean`).
fn exploration(field: &str, s: &str) -> PyResult<ExplorationType> {
    match s.to_ascii_lowercase().as_str() {
        "random" => Ok(ExplorationType::Random),
        "deterministic" | "mode" | "mean" => Ok(ExplorationType::Deterministic),
        other => Err(config_error(
            field,
            format!("{other:?} is not one of random, deterministic, mode, mean"),
        )),
    }
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

/// The builder for these settings (the dict is consumed).
pub(crate) fn builder(dict: Bound<'_, PyDict>) -> PyResult<CollectorBuilder> {
    let s = Settings { dict };
    let mut b = CollectorBuilder::default();

    let env_config = s.take::<String>("env_config", "a JSON string")?;
    match s.take::<String>("env", "an env name (e.g. \"CartPole-v1\")")? {
        Some(name) => b = b.env(env_spec("env_config", name, env_config)?),
        None => return Err(config_error("env", "required: the name of a registered env")),
    }
    if let Some(json) = s.take::<String>("env_spec", "a JSON string")? {
        let specs = rollout::space::EnvSpecs::from_json(&json)
            .map_err(|e| config_error("env_spec", format!("not the specs of an env: {e}")))?;
        b = b.env_spec(specs);
    }
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
    match s.take::<usize>("frames_per_batch", "a positive integer")? {
        Some(f) => b = b.frames_per_batch(f),
        None => return Err(config_error("frames_per_batch", "required")),
    }
    if let Some(t) = s.take("total_frames", "an integer (-1: endless)")? {
        b = b.total_frames(t);
    }
    if let Some(n) = s.take("nodes", "a positive integer")? {
        b = b.nodes(n);
    }
    if let Some(n) = s.take("min_nodes", "a positive integer")? {
        b = b.min_nodes(n);
    }
    if let Some(n) = s.take("max_nodes", "a positive integer")? {
        b = b.max_nodes(n);
    }
    if let Some(k) = s.take("envs_per_node", "a positive integer")? {
        b = b.envs_per_node(k);
    }
    if let Some(k) = s.take("envs_per_worker", "a positive integer")? {
        b = b.envs_per_worker(k);
    }
    if let Some(v) = s.take("sync", "a bool")? {
        b = b.sync(v);
    }
    if let Some(v) = s.take("seed", "a non-negative integer")? {
        b = b.seed(v);
    }
    if let Some(v) = s.take("update_after_each_batch", "a bool")? {
        b = b.update_after_each_batch(v);
    }
    if let Some(v) = s.take("max_weight_update_interval", "a positive integer")? {
        b = b.max_weight_update_interval(v);
    }
    if let Some(v) = s.take("update_interval", "a positive integer")? {
        b = b.update_interval(v);
    }
    if let Some(v) = s.take("max_frames_per_traj", "a positive integer")? {
        b = b.max_frames_per_traj(v);
    }
    if let Some(v) = s.take("init_random_frames", "a non-negative integer")? {
        b = b.init_random_frames(v);
    }
    if let Some(v) = s.take("reset_at_each_iter", "a bool")? {
        b = b.reset_at_each_iter(v);
    }
    if let Some(v) = s.take("nan_is_failure", "a bool")? {
        b = b.nan_is_failure(v);
    }
    if let Some(v) = s.take("allow_nonfinite_weights", "a bool")? {
        b = b.allow_nonfinite_weights(v);
    }
    if let Some(v) = s.take("split_trajs", "a bool")? {
        b = b.split_trajs(v);
    }
    if let Some(e) = s.take::<String>("exploration_type", "a string")? {
        b = b.exploration_type(exploration("exploration_type", &e)?);
    }
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

    if let Some(d) = s.seconds("batch_timeout")? {
        b = b.batch_timeout(d);
    }
    if let Some(d) = s.seconds("shutdown_timeout")? {
        b = b.shutdown_timeout(d);
    }
    if let Some(v) = s.take("max_restarts", "a non-negative integer")? {
        b = b.max_restarts(v);
    }
    if let Some(d) = s.seconds("restart_window")? {
        b = b.restart_window(d);
    }
    if let Some(v) = s.take("worker_nice", "an integer in 0..=19")? {
        b = b.worker_nice(v);
    }
    if let Some(v) = s.take("node_max_restarts", "a non-negative integer")? {
        b = b.node_max_restarts(v);
    }
    if let Some(d) = s.seconds("node_restart_window")? {
        b = b.node_restart_window(d);
    }
    if let Some(d) = s.seconds("continue_timeout")? {
        b = b.continue_timeout(d);
    }
    if let Some(v) = s.take("continue_without_lost_nodes", "a bool")? {
        b = b.continue_without_lost_nodes(v);
    }
    if let Some(v) = s.take::<String>("listen", "an address HOST:PORT")? {
        b = b.listen(v);
    }
    if let Some(v) = s.take::<String>("metrics", "an address HOST:PORT")? {
        b = b.metrics(v);
    }
    if let Some(d) = s.seconds("metrics_linger")? {
        b = b.metrics_linger(d);
    }
    if let Some(v) = s.take::<Vec<u8>>("token", "bytes")? {
        b = b.token(v);
    }
    if let Some(d) = s.seconds("join_timeout")? {
        b = b.join_timeout(d);
    }
    let heartbeat = s.seconds("heartbeat")?;
    let heartbeat_timeout = s.seconds("heartbeat_timeout")?;
    if heartbeat.is_some() || heartbeat_timeout.is_some() {
        b = b.heartbeat(
            heartbeat.unwrap_or(Duration::from_secs(1)),
            heartbeat_timeout.unwrap_or(Duration::from_secs(5)),
        );
    }
    if let Some(d) = s.seconds("handshake_timeout")? {
        b = b.handshake_timeout(d);
    }
    if let Some(p) = s.take::<PathBuf>("node_program", "a path to the rollout binary")? {
        b = b.node_program(p);
    }
    if let Some(argv) = s.take::<Vec<String>>("node_command", "a list of strings: the program, then its arguments")? {
        b = b.node_command(argv);
    }
    if let Some(v) = s.take("max_frame", "a number of bytes")? {
        b = b.max_frame(v);
    }
    if let Some(v) = s.take::<String>("advertise", "HOST[:PORT]")? {
        b = b.advertise(v);
    }
    if let Some(bytes) = s.take::<Vec<u8>>("resume", "checkpoint bytes (state_dict()[\"checkpoint\"])")? {
        let c = Checkpoint::from_bytes(&bytes).map_err(|e| config_error("resume", e))?;
        b = b.resume(c);
    }
    if let Some(k) = s.unknown() {
        return Err(config_error(&k, "unknown argument"));
    }
    Ok(b)
}
