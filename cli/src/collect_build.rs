//! `rollout collect`'s flags turned into a running [`DistributedCollector`].

use std::path::Path;
use std::time::Duration;

use rollout::policy::OnnxHead;
use rollout::space::EnvSpecs;
use rollout::{EnvSpec, ExplorationType, PolicyConfig};
use rollout_actors::bounded_file::{read_bounded, ENV_SPEC_FILE};
use rollout_actors::policy_file::onnx_policy;
use rollout_actors::remote::{read_token, JoinError};
use rollout_actors::{DistributedCollector, Launcher};

use crate::collect_args::{CollectArgs, Exploration, PolicyKind};
use crate::failure::{build_failure, usage, Failure};
use crate::LauncherKind;

/// The run's policy from the flags; for `--policy onnx` without `--policy-file` on
/// `--resume`, the model the checkpoint holds (a file given must be that model).
pub(crate) fn policy_config(args: &CollectArgs, held: Option<&PolicyConfig>) -> Result<PolicyConfig, Failure> {
    if args.policy == PolicyKind::Onnx && args.policy_file.is_none() {
        if let Some(PolicyConfig::Onnx { model, .. }) = held {
            let head = match args.onnx_head.as_deref() {
                Some(name) => OnnxHead::from_name(name).ok_or_else(|| {
                    usage(
                        "onnx_head",
                        format!("`{name}` is not one of categorical, normal, tanh_normal, deterministic"),
                    )
                })?,
                None => return Err(usage("onnx_head", "required by `--policy onnx`")),
            };
            return Ok(PolicyConfig::Onnx {
                model: model.clone(),
                head,
            });
        }
    }
    let config = flags_policy(args)?;
    if let (PolicyConfig::Onnx { model, .. }, Some(PolicyConfig::Onnx { model: old, .. })) = (&config, held) {
        if model != old {
            return Err(usage(
                "policy_file",
                "not the model the checkpoint was taken with (leave --policy-file out to use the checkpoint's)",
            ));
        }
    }
    Ok(config)
}

fn flags_policy(args: &CollectArgs) -> Result<PolicyConfig, Failure> {
    if args.hidden.is_some() && args.policy != PolicyKind::Mlp {
        return Err(usage("hidden", "only used by `--policy mlp`"));
    }
    if args.value.is_some() && args.policy != PolicyKind::Constant {
        return Err(usage("value", "only used by `--policy constant`"));
    }
    if args.policy != PolicyKind::Onnx {
        if args.policy_file.is_some() {
            return Err(usage("policy_file", "only used by `--policy onnx`"));
        }
        if args.onnx_head.is_some() {
            return Err(usage("onnx_head", "only used by `--policy onnx`"));
        }
    }
    Ok(match args.policy {
        PolicyKind::Random => PolicyConfig::Random,
        PolicyKind::Linear => PolicyConfig::Linear,
        PolicyKind::Mlp => {
            let hidden = args.hidden.clone().unwrap_or_else(|| vec![64, 64]);
            if hidden.contains(&0) {
                return Err(usage("hidden", "every layer needs at least one unit"));
            }
            PolicyConfig::Mlp { hidden }
        }
        PolicyKind::Constant => {
            let value = args.value.unwrap_or(1.0);
            if !value.is_finite() {
                return Err(usage("value", format!("{value} is not finite")));
            }
            PolicyConfig::Constant { value }
        }
        PolicyKind::Onnx => onnx_config(args)?,
    })
}

/// `--policy onnx`: the file read and parsed once, here, before any node starts.
fn onnx_config(args: &CollectArgs) -> Result<PolicyConfig, Failure> {
    let path = args
        .policy_file
        .as_ref()
        .ok_or_else(|| usage("policy_file", "required by `--policy onnx`"))?;
    let name = args.onnx_head.as_deref().ok_or_else(|| {
        usage(
            "onnx_head",
            "required by `--policy onnx`: categorical, normal, tanh_normal or deterministic",
        )
    })?;
    let head = OnnxHead::from_name(name).ok_or_else(|| {
        usage(
            "onnx_head",
            format!("`{name}` is not one of categorical, normal, tanh_normal, deterministic"),
        )
    })?;
    onnx_policy(path, head).map_err(|e| usage("policy_file", e))
}

/// `SECS` of flag `field` as a duration, longer than zero.
fn secs(field: &'static str, s: f64) -> Result<Duration, Failure> {
    match Duration::try_from_secs_f64(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(usage(field, format!("{s} is not a number of seconds above zero"))),
    }
}

/// Node supervision: on by default for remote launchers (3 restarts within 60 s),
/// off with `--node-max-restarts 0`; the local launcher supervises only when asked.
fn supervise(
    b: rollout_actors::CollectorBuilder,
    args: &CollectArgs,
    launcher: &Launcher,
) -> Result<rollout_actors::CollectorBuilder, Failure> {
    let window = secs("node_restart_window", args.node_restart_window)?;
    let elastic = args.max_nodes.is_some() || args.min_nodes.is_some();
    let max = match (args.node_max_restarts, launcher) {
        // An elastic run restarts no node: supervision stays off unless asked (and refused).
        (Some(0), _) | (None, Launcher::Local) => return Ok(b),
        (None, _) if elastic => return Ok(b),
        (Some(n), _) => n,
        (None, _) => DEFAULT_NODE_MAX_RESTARTS,
    };
    Ok(b.node_max_restarts(max).node_restart_window(window))
}

/// Nodes of `rollout collect` without `--nodes` (nor `--max-nodes`).
const DEFAULT_NODES: usize = 2;

/// Restarts of one node within `--node-restart-window` the CLI allows by default.
const DEFAULT_NODE_MAX_RESTARTS: u32 = 3;

/// The deadlines on the nodes' answers.
fn deadlines(
    mut b: rollout_actors::CollectorBuilder,
    args: &CollectArgs,
) -> Result<rollout_actors::CollectorBuilder, Failure> {
    b = b
        .heartbeat(
            secs("heartbeat", args.heartbeat)?,
            secs("heartbeat_timeout", args.heartbeat_timeout)?,
        )
        .shutdown_ack_timeout(secs("shutdown_ack_timeout", args.shutdown_ack_timeout)?);
    if let Some(s) = args.request_timeout {
        b = b.request_timeout(secs("request_timeout", s)?);
    }
    if let Some(s) = args.seed_timeout {
        b = b.seed_timeout(secs("seed_timeout", s)?);
    }
    if let Some(s) = args.update_weights_timeout {
        b = b.update_weights_timeout(secs("update_weights_timeout", s)?);
    }
    if let Some(s) = args.snapshot_timeout {
        b = b.snapshot_timeout(secs("snapshot_timeout", s)?);
    }
    if let Some(s) = args.continue_timeout {
        b = b.continue_timeout(secs("continue_timeout", s)?);
    }
    Ok(b)
}

/// `--node-command`: its words, for a launcher that starts nodes.
fn node_command(command: &str, launcher: &Launcher) -> Result<Vec<String>, Failure> {
    if !matches!(launcher, Launcher::Process | Launcher::Slurm(_)) {
        return Err(usage(
            "node_command",
            "only used by `--launcher process` and `--launcher slurm`",
        ));
    }
    match shlex::split(command) {
        Some(words) if !words.is_empty() => Ok(words),
        Some(_) => Err(usage("node_command", "empty: give the program, then its arguments")),
        None => Err(usage(
            "node_command",
            format!("{command:?} has an unclosed quote or a trailing backslash"),
        )),
    }
}

/// `--env-spec`: JSON, or `@FILE` holding JSON, of the env's specs (a regular file of at
/// most 1 MiB); a bad one names the key at fault, a key given twice included.
fn env_spec(arg: &str) -> Result<EnvSpecs, Failure> {
    let text = match arg.strip_prefix('@') {
        Some(path) => {
            let bytes = read_bounded(Path::new(path), ENV_SPEC_FILE).map_err(|e| usage("env_spec", e))?;
            String::from_utf8(bytes).map_err(|e| usage("env_spec", format!("{path} is not UTF-8 text: {e}")))?
        }
        None => arg.to_string(),
    };
    EnvSpecs::from_json(&text).map_err(|e| usage("env_spec", e))
}

pub(crate) fn build(
    args: &CollectArgs,
    resume: Option<rollout::checkpoint::Checkpoint>,
    policy: PolicyConfig,
) -> Result<DistributedCollector, Failure> {
    let config = match &args.env_config {
        None => serde_json::Value::Null,
        Some(s) => serde_json::from_str(s).map_err(|e| usage("env_config", format!("not valid JSON: {e}")))?,
    };
    let env = EnvSpec {
        name: args.env.clone(),
        config,
    };
    let batch_timeout = args
        .batch_timeout
        .map(|s| {
            Duration::try_from_secs_f64(s)
                .map_err(|_| usage("batch_timeout", format!("{s} is not a number of seconds")))
        })
        .transpose()?;
    let slurm = args.slurm.options(args.launcher == LauncherKind::Slurm)?;
    let launcher = match (args.launcher, &args.listen, slurm) {
        (_, _, Some(o)) => Launcher::Slurm(o),
        (LauncherKind::Local, Some(_), _) | (LauncherKind::External, _, _) => Launcher::External,
        (LauncherKind::Local, None, _) => Launcher::Local,
        (LauncherKind::Process | LauncherKind::Slurm, _, _) => Launcher::Process,
    };
    let join_timeout = Duration::try_from_secs_f64(args.join_timeout).map_err(|_| {
        usage(
            "join_timeout",
            format!("{} is not a number of seconds", args.join_timeout),
        )
    })?;
    let env_specs = args.env_spec.as_deref().map(env_spec).transpose()?;
    let mut b = DistributedCollector::builder()
        .env(env)
        .policy(policy)
        .envs_per_node(args.envs_per_node)
        .envs_per_worker(args.envs_per_worker)
        .frames_per_batch(args.frames_per_batch)
        .total_frames(args.total_frames)
        .sync(args.sync)
        .launcher(launcher.clone())
        .update_after_each_batch(args.update_after_each_batch)
        .init_random_frames(args.init_random_frames)
        .reset_at_each_iter(args.reset_at_each_iter)
        .split_trajs(args.split_trajs);
    if let Some(t) = batch_timeout {
        b = b.batch_timeout(t);
    }
    if let Some(s) = env_specs {
        b = b.env_spec(s);
    }
    if let Some(n) = args.nodes {
        b = b.nodes(n);
    } else if args.max_nodes.is_none() {
        b = b.nodes(DEFAULT_NODES);
    }
    if let Some(n) = args.max_nodes {
        b = b.max_nodes(n);
    }
    if let Some(n) = args.min_nodes {
        b = b.min_nodes(n);
    }
    if args.max_nodes.is_some() && args.checkpoint.is_some() {
        return Err(usage(
            "checkpoint",
            "an elastic run (--max-nodes) takes no checkpoint: its membership changes and is not part of one",
        ));
    }
    if let Some(s) = args.seed {
        b = b.seed(s);
    }
    if let Some(e) = args.exploration_type {
        b = b.exploration_type(match e {
            Exploration::Deterministic => ExplorationType::Deterministic,
            Exploration::Random => ExplorationType::Random,
        });
    }
    if let Some(n) = args.max_weight_update_interval {
        b = b.max_weight_update_interval(n);
    }
    b = supervise(b, args, &launcher)?;
    b = deadlines(b, args)?;
    b = b.worker_nice(args.worker_nice);
    if let Some(n) = args.update_interval {
        b = b.update_interval(n);
    }
    if let Some(n) = args.max_frames_per_traj {
        b = b.max_frames_per_traj(n);
    }
    b = b.join_timeout(join_timeout);
    if let Some(addr) = &args.listen {
        b = b.listen(addr.clone());
    }
    if launcher == Launcher::External {
        // As soon as the socket is bound, before any node joined: with `--listen HOST:0`
        // this line is how nodes learn the port.
        let json = args.json;
        b = b.on_listening(move |addr| {
            eprintln!("listening on {addr}");
            if json {
                println!("{}", serde_json::json!({ "listening": addr.to_string() }));
            }
        });
    }
    if let Some(addr) = &args.slurm.advertise {
        b = b.advertise(addr.clone());
    }
    if let Some(command) = &args.node_command {
        b = b.node_command(node_command(command, &launcher)?);
    }
    if launcher != Launcher::Local {
        match read_token(args.token_file.as_deref(), args.allow_insecure_token_file) {
            Ok(t) => b = b.token(t),
            Err(JoinError::NoToken) if matches!(launcher, Launcher::Process | Launcher::Slurm(_)) => {}
            Err(e) => return Err(usage("token", e)),
        }
    }
    if let Some(ck) = resume {
        b = b.resume(ck);
    }
    if let Some(addr) = &args.metrics {
        let linger = Duration::try_from_secs_f64(args.metrics_linger).map_err(|_| {
            usage(
                "metrics_linger",
                format!("{} is not a number of seconds", args.metrics_linger),
            )
        })?;
        b = b.metrics(addr.clone()).metrics_linger(linger);
    }
    let c = b.build().map_err(build_failure)?;
    if let Some(addr) = c.metrics_addr() {
        eprintln!("metrics on http://{addr}/metrics");
        if args.json {
            println!("{}", serde_json::json!({ "metrics": addr.to_string() }));
        }
    }
    if let Some(job) = c.slurm_job_id() {
        eprintln!("SLURM job {job}: every node joined");
    }
    Ok(c)
}
