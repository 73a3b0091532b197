//! `rollout train`: PPO on the nodes' batches until a target mean return (exit 0) or a frame
//! budget (exit 1). A progress bar on stderr (hidden with `--quiet` or when stderr is not a
//! terminal), then one summary line on stderr, or one JSON object on stdout with `--json`:
//! `{"reached": bool, "episodes": .., "frames": .., "batches": .., "seconds": .., "mean_return": ..,
//! "best_return": .., "weights_version": .., "returns": [..]}`.

use std::io::{self, IsTerminal, Write};
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rollout::learn::PpoConfig;
use rollout::{EnvSpec, PolicyConfig};
use rollout_actors::learner::{train as run_training, Flow, TrainConfig};
use rollout_actors::Launcher;

use crate::failure::{usage, Failure};
use crate::LauncherKind;

/// Flags of `rollout train`; the defaults solve CartPole-v1.
#[derive(Args, Debug)]
pub(crate) struct TrainArgs {
    /// Registered env name (discrete actions).
    #[arg(long, default_value = "CartPole-v1")]
    env: String,
    /// Seed of the run (envs, initial weights, minibatches).
    #[arg(long, default_value_t = 0, value_name = "S")]
    seed: u64,
    /// Number of nodes.
    #[arg(long, default_value_t = 2, value_name = "N")]
    nodes: usize,
    /// Env workers per node.
    #[arg(long, default_value_t = 2, value_name = "K")]
    envs_per_node: usize,
    /// Frames per batch; one PPO update per batch.
    #[arg(long, default_value_t = 2048, value_name = "F")]
    frames_per_batch: usize,
    /// Adam learning rate (policy and value network).
    #[arg(long, default_value_t = 1e-3, value_name = "LR")]
    lr: f64,
    /// Hidden layer widths of the policy (tanh MLP); empty for a linear policy.
    #[arg(long, value_delimiter = ',', default_value = "32,32", value_name = "W,W,..")]
    hidden: Vec<usize>,
    /// PPO passes over each batch.
    #[arg(long, default_value_t = 10, value_name = "N")]
    epochs: usize,
    /// Frames per gradient step.
    #[arg(long, default_value_t = 256, value_name = "M")]
    minibatch: usize,
    /// Stop once the mean return of the last 20 episodes reaches this.
    #[arg(long, default_value_t = 475.0, value_name = "R", allow_negative_numbers = true)]
    target: f64,
    /// Give up (exit 1) after this many frames.
    #[arg(long, default_value_t = 500_000, value_name = "T")]
    max_frames: u64,
    /// Async collection with the learner subscribed (faster, not reproducible).
    #[arg(long = "async")]
    asynchronous: bool,
    /// Where the nodes run.
    #[arg(long, value_enum, default_value_t = LauncherKind::Local)]
    launcher: LauncherKind,
    /// Longest wait for one batch, in seconds.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    batch_timeout: f64,
    /// Save a checkpoint (collector and learner) to PATH every `--checkpoint-every` batches.
    #[arg(long, value_name = "PATH")]
    checkpoint: Option<std::path::PathBuf>,
    /// Batches between two checkpoints.
    #[arg(long, default_value_t = 10, value_name = "N")]
    checkpoint_every: u64,
    /// Go on from a checkpoint written by `--checkpoint` (same flags otherwise).
    #[arg(long, value_name = "PATH")]
    resume: Option<std::path::PathBuf>,
    /// Serve the run's metrics for Prometheus at http://ADDR/metrics (e.g. 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// A JSON summary on stdout.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

fn config(args: &TrainArgs) -> Result<TrainConfig, Failure> {
    let launcher = match args.launcher {
        LauncherKind::Local => Launcher::Local,
        LauncherKind::Process => Launcher::Process,
        LauncherKind::External | LauncherKind::Slurm => {
            return Err(usage(
                "launcher",
                "`train` starts its nodes itself: use local or process",
            ))
        }
    };
    if args.hidden.contains(&0) {
        return Err(usage("hidden", "every layer needs at least one unit"));
    }
    let batch_timeout = Duration::try_from_secs_f64(args.batch_timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            usage(
                "batch_timeout",
                format!("{} is not a positive number of seconds", args.batch_timeout),
            )
        })?;
    let policy = if args.hidden.is_empty() {
        PolicyConfig::Linear
    } else {
        PolicyConfig::Mlp {
            hidden: args.hidden.clone(),
        }
    };
    Ok(TrainConfig {
        env: EnvSpec::from(args.env.as_str()),
        policy,
        seed: args.seed,
        nodes: args.nodes,
        envs_per_node: args.envs_per_node,
        frames_per_batch: args.frames_per_batch,
        sync: !args.asynchronous,
        launcher,
        node_program: None,
        flow: if args.asynchronous {
            Flow::Subscribe
        } else {
            Flow::Lockstep
        },
        ppo: PpoConfig {
            lr: args.lr,
            value_lr: args.lr,
            epochs: args.epochs,
            minibatch: args.minibatch,
            ..PpoConfig::default()
        },
        target: args.target,
        window: 20,
        max_frames: args.max_frames,
        batch_timeout,
        checkpoint: args.checkpoint.clone(),
        checkpoint_every: args.checkpoint_every,
        resume: args.resume.clone(),
        metrics: args.metrics.clone(),
    })
}

fn bar(args: &TrainArgs) -> ProgressBar {
    if args.quiet || !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(args.max_frames), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{wide_bar}] {human_pos}/{human_len} frames, {msg}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message("starting");
    pb
}

/// Runs `rollout train`.
pub(crate) fn train(args: &TrainArgs) -> Result<(), Failure> {
    let cfg = config(args)?;
    let pb = bar(args);
    let result = run_training(cfg, |p| {
        pb.set_position(p.frames);
        let mean = p.mean_return.map_or_else(|| "-".to_string(), |m| format!("{m:.1}"));
        pb.set_message(format!(
            "{:.0} frames/s, mean return {mean} ({} episodes), weights v{}",
            p.fps, p.episodes, p.weights_version
        ));
    });
    pb.finish_and_clear();
    let s = result.map_err(|e| {
        if e.is_config() {
            Failure::Usage(e.to_string())
        } else {
            Failure::Runtime(e.to_string())
        }
    })?;
    if args.json {
        let line = serde_json::to_string(&s).map_err(|e| Failure::Runtime(e.to_string()))?;
        let mut out = io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| Failure::Runtime(format!("writing stdout: {e}")))?;
    }
    let mean = s.mean_return.map_or_else(|| "-".to_string(), |m| format!("{m:.1}"));
    let line = format!(
        "{} after {} episodes, {} frames, {:.1} s: mean return of the last 20 episodes {mean}",
        if s.reached {
            "target reached"
        } else {
            "frame budget spent"
        },
        s.episodes,
        s.frames,
        s.seconds
    );
    if s.reached {
        if !args.json {
            eprintln!("{line}");
        }
        Ok(())
    } else {
        Err(Failure::Runtime(line))
    }
}
