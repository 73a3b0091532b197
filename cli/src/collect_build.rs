//! `rollout collect`'s flags turned into a running [`DistributedCollector`].

use std::time::Duration;

use rollout::policy::OnnxHead;
use rollout::PolicyConfig;
use rollout_actors::policy_file::onnx_policy;
use rollout_actors::remote::{read_token, JoinError};
use rollout_actors::{CollectorArgs, DistributedCollector, Launcher, Secs};

use crate::collect_args::{CollectArgs, PolicyKind};
use crate::failure::{build_failure, usage, Failure};
use crate::LauncherKind;

/// The run's policy from the flags; for `--policy onnx` without `--policy-file` on
/// `--resume`, the model the checkpoint holds (a file given must be that model).
pub(crate) fn policy_config(args: &CollectArgs, held: Option<&PolicyConfig>) -> Result<PolicyConfig, Failure> {
    if args.policy == PolicyKind::Onnx && args.policy_file.is_none() {
        if let Some(PolicyConfig::Onnx {
            model,
            state,
            exploration,
            ..
        }) = held
        {
            let head = match args.onnx_head.as_deref() {
                Some(name) => OnnxHead::from_name(name).ok_or_else(|| {
                    usage(
                        "onnx_head",
                        format!("`{name}` is not one of categorical, normal, tanh_normal, deterministic, qvalue"),
                    )
                })?,
                None => return Err(usage("onnx_head", "required by `--policy onnx`")),
            };
            return Ok(PolicyConfig::Onnx {
                model: model.clone(),
                head,
                state: state.clone(),
                exploration: exploration.clone(),
            });
        }
    }
    let mut config = flags_policy(args)?;
    if let (
        PolicyConfig::Onnx {
            model,
            state,
            exploration,
            ..
        },
        Some(PolicyConfig::Onnx {
            model: old,
            state: old_state,
            exploration: old_exploration,
            ..
        }),
    ) = (&mut config, held)
    {
        if model != old {
            return Err(usage(
                "policy_file",
                "not the model the checkpoint was taken with (leave --policy-file out to use the checkpoint's)",
            ));
        }
        // The checkpoint's exploration module (a run the Python module started) goes on.
        if old_exploration.is_some() {
            state.clone_from(old_state);
            exploration.clone_from(old_exploration);
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
            "required by `--policy onnx`: categorical, normal, tanh_normal, deterministic or qvalue",
        )
    })?;
    let head = OnnxHead::from_name(name).ok_or_else(|| {
        usage(
            "onnx_head",
            format!("`{name}` is not one of categorical, normal, tanh_normal, deterministic, qvalue"),
        )
    })?;
    onnx_policy(path, head).map_err(|e| usage("policy_file", e))
}

/// Node supervision: on by default for remote launchers (3 restarts within 60 s),
/// off with `--node-max-restarts 0`; the local launcher and an elastic run supervise
/// only when asked (either flag given).
fn supervise(run: &mut CollectorArgs, launcher: &Launcher) {
    let elastic = run.max_nodes.is_some() || run.min_nodes.is_some();
    let asked = run.node_max_restarts.is_some() || run.node_restart_window.is_some();
    if run.node_max_restarts == Some(0) {
        run.node_max_restarts = None;
        run.node_restart_window = None;
    } else if asked || !(elastic || *launcher == Launcher::Local) {
        run.node_max_restarts.get_or_insert(DEFAULT_NODE_MAX_RESTARTS);
        run.node_restart_window.get_or_insert(DEFAULT_NODE_RESTART_WINDOW);
    }
}

/// Nodes of `rollout collect` without `--nodes` (nor `--max-nodes`).
const DEFAULT_NODES: usize = 2;

/// Restarts of one node within `--node-restart-window` the CLI allows by default.
const DEFAULT_NODE_MAX_RESTARTS: u32 = 3;

/// The window the CLI counts node restarts in by default.
const DEFAULT_NODE_RESTART_WINDOW: Secs = Secs(Duration::from_secs(60));

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

pub(crate) fn build(
    args: &CollectArgs,
    resume: Option<rollout::checkpoint::Checkpoint>,
    policy: PolicyConfig,
) -> Result<DistributedCollector, Failure> {
    let mut run = args.run.clone();
    if run.advertise.is_some() && args.launcher != LauncherKind::Slurm {
        return Err(usage("advertise", "only used by `--launcher slurm`"));
    }
    let slurm = args.slurm.options(args.launcher == LauncherKind::Slurm)?;
    let launcher = match (args.launcher, &run.listen, slurm) {
        (_, _, Some(o)) => Launcher::Slurm(o),
        (LauncherKind::Local, Some(_), _) | (LauncherKind::External, _, _) => Launcher::External,
        (LauncherKind::Local, None, _) => Launcher::Local,
        (LauncherKind::Process | LauncherKind::Slurm, _, _) => Launcher::Process,
    };
    if run.nodes.is_none() && run.max_nodes.is_none() {
        run.nodes = Some(DEFAULT_NODES);
    }
    if run.max_nodes.is_some() && args.checkpoint.is_some() {
        return Err(usage(
            "checkpoint",
            "an elastic run (--max-nodes) takes no checkpoint: its membership changes and is not part of one",
        ));
    }
    supervise(&mut run, &launcher);
    let mut b = DistributedCollector::builder()
        .policy(policy)
        .launcher(launcher.clone());
    b = run.apply(b).map_err(|e| usage(e.field, e.reason))?;
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
