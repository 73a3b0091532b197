//! `rollout`: the command line of the rollout collector.
//!
//! ```text
//! rollout collect --env CartPole-v1 --nodes 2 --frames-per-batch 1000 --total-frames 10000 --json
//! ```
//!
//! # Exit status
//!
//! * `0`: every batch was collected.
//! * `2`: a bad flag or a bad value (unknown env, `frames_per_batch` that does not divide, invalid
//!   JSON, ...); nothing was collected and stderr holds ONE line `error: ...` naming the problem.
//! * `1`: a runtime error after the collection started; stderr ends with one line `error: ...`.
//!
//! # `--json`
//!
//! One JSON object per line on stdout for every yielded batch,
//! `{"batch": i, "frames": n, "node": k|null, "weights_version": v}` (`node` is `null` for sync
//! batches, which stack a share of every node; `frames` counts real frames, padding excluded after
//! `--split-trajs`), then one summary object `{"frames": .., "batches": .., "seconds": .., "fps": ..}`.
//!
//! # `--output FILE` format
//!
//! FILE is created (truncated if it exists) and every yielded batch is appended to it, in order, as
//! one MessagePack map with named fields (`rmp_serde::encode::write_named`); the file is the plain
//! concatenation of these maps, with no header and no length prefix, so read it by decoding maps
//! until end of file:
//!
//! ```text
//! {
//!   "batch": u64,                 // 0-based index of the batch in the run
//!   "node": u64 | nil,            // the node that collected it (async), nil for a sync batch
//!   "weights_version": u64,       // oldest policy weights version among its frames
//!   "data": {                     // one entry per batch key, the dotted path as the key
//!     KEY: {                      // e.g. "observation", "action", "next.reward", "collector.traj_ids"
//!       "dtype": "f32" | "f64" | "i64" | "bool" | "u8",
//!       "shape": [u64, ...],      // batch dims first: [envs, T] async, [nodes, envs, T] sync,
//!                                 // [n_traj, max_len] with --split-trajs; then the feature dims
//!       "data": bin               // the elements, little-endian, C order (bool: one byte, 0 or 1)
//!     }, ...
//!   }
//! }
//! ```
//!
//! Each `data` value is exactly the serde form of `rollout::Tensor`, so in Rust a record decodes
//! into `struct { batch: u64, node: Option<usize>, weights_version: u64, data: BTreeMap<String,
//! rollout::Tensor> }` with `rmp_serde::decode::from_read` called repeatedly on one reader.

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Seek, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rollout::rollout::keys;
use rollout::{EnvSpec, ExplorationType, PolicyConfig, Tensor, TensorDict};
use rollout_actors::remote::{read_token, run_node, JoinError, NodeOptions};
use rollout_actors::{CollectError, Collected, DistributedCollector, Launcher, SlurmOptions};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use tracing_subscriber::EnvFilter;

#[path = "rollout/resume.rs"]
mod resume;

/// Distributed reinforcement-learning data collection.
#[derive(Parser, Debug)]
#[command(name = "rollout", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Collect batches of frames from envs stepped by a policy on nodes.
    Collect(Box<CollectArgs>),
    /// Join a trainer as a node and serve it until it shuts down.
    Node(NodeArgs),
    /// Train a policy with PPO until the mean return of the last 20 episodes reaches a target.
    Train(Box<train_cmd::TrainArgs>),
}

#[derive(Args, Debug)]
struct NodeArgs {
    /// The trainer's address, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    join: String,
    /// File holding the shared token (else the ROLLOUT_TOKEN env var). Never pass it as an argument.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Name shown in the trainer's logs [default: host:pid].
    #[arg(long)]
    name: Option<String>,
    /// Ask for this node index (a node rejoining its slot).
    #[arg(long, value_name = "I")]
    index: Option<usize>,
    /// Give up connecting after this many seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    connect_timeout: f64,
}

/// The policy kinds of `--policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PolicyKind {
    /// Uniform samples of the action spec.
    Random,
    /// One linear layer.
    Linear,
    /// Tanh hidden layers (see `--hidden`), then a linear output.
    Mlp,
    /// Every action is `--value`.
    Constant,
}

/// `--exploration-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Exploration {
    /// The mode of the action distribution.
    Deterministic,
    /// A sample of the action distribution.
    Random,
}

/// `--launcher`: where the nodes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LauncherKind {
    /// Nodes on threads of this process.
    Local,
    /// Child processes of this binary joining over loopback.
    Process,
    /// Nodes started by anyone else with `rollout node --join` (see `--listen`).
    External,
    /// ONE sbatch job array of `--nodes` tasks (see `--advertise` and the SLURM options).
    Slurm,
}

#[derive(Args, Debug)]
struct CollectArgs {
    /// Registered env name (CartPole-v1, Pendulum-v1, MountainCarContinuous-v0, Counting).
    #[arg(long, default_value = "CartPole-v1")]
    env: String,
    /// Env config as a JSON object, e.g. '{"max_episode_steps": 200}'.
    #[arg(long, value_name = "JSON")]
    env_config: Option<String>,
    /// Number of nodes.
    #[arg(long, default_value_t = 2, value_name = "N")]
    nodes: usize,
    /// Env workers per node.
    #[arg(long, default_value_t = 1, value_name = "K")]
    envs_per_node: usize,
    /// Frames per yielded batch.
    #[arg(long, default_value_t = 1000, value_name = "F")]
    frames_per_batch: usize,
    /// Frames to collect in all; -1 collects until killed.
    #[arg(long, default_value_t = 10000, value_name = "T", allow_negative_numbers = true)]
    total_frames: i64,
    /// Sync collection (every batch stacks a share of every node); default async.
    #[arg(long)]
    sync: bool,
    /// Seed of the run (drawn from the clock when absent).
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// Policy.
    #[arg(long, value_enum, default_value_t = PolicyKind::Linear)]
    policy: PolicyKind,
    /// Hidden layer widths of `--policy mlp` [default: 64,64].
    #[arg(long, value_delimiter = ',', value_name = "W,W,..")]
    hidden: Option<Vec<usize>>,
    /// Action value of `--policy constant` [default: 1].
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    value: Option<f32>,
    /// Deterministic (mode) or random (sampled) actions.
    #[arg(long, value_enum)]
    exploration_type: Option<Exploration>,
    /// Where the nodes run.
    #[arg(long, value_enum, default_value_t = LauncherKind::Local)]
    launcher: LauncherKind,
    /// Push stored weights before each collection.
    #[arg(long)]
    update_after_each_batch: bool,
    /// Update a node that produced more than N batches since its last update.
    #[arg(long, value_name = "N")]
    max_weight_update_interval: Option<u64>,
    /// Push stored weights to all nodes every N yielded batches.
    #[arg(long, value_name = "N")]
    update_interval: Option<u64>,
    /// Truncate trajectories longer than N frames.
    #[arg(long, value_name = "N")]
    max_frames_per_traj: Option<u64>,
    /// Frames stepped with a random policy first.
    #[arg(long, default_value_t = 0, value_name = "N")]
    init_random_frames: u64,
    /// Start each batch with fresh episodes.
    #[arg(long)]
    reset_at_each_iter: bool,
    /// Yield batches split into trajectories ([n_traj, max_len] with `collector.mask`).
    #[arg(long)]
    split_trajs: bool,
    /// Address remote nodes join [default: 127.0.0.1:0]; setting it implies
    /// `--launcher external` unless another remote launcher is given.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// File holding the shared token for remote nodes (else ROLLOUT_TOKEN).
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Longest wait for remote nodes to join, in seconds.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    join_timeout: f64,
    /// Longest wait for one batch, in seconds.
    #[arg(long, default_value_t = 60.0, value_name = "SECS", allow_negative_numbers = true)]
    batch_timeout: f64,
    /// Save a checkpoint to PATH every `--checkpoint-every` batches (with the length of the
    /// `--output` file, which a resumed run cuts back to it).
    #[arg(long, value_name = "PATH")]
    checkpoint: Option<PathBuf>,
    /// Batches between two checkpoints.
    #[arg(long, default_value_t = 10, value_name = "N")]
    checkpoint_every: u64,
    /// Go on from a checkpoint written by `--checkpoint` (same flags otherwise; a larger
    /// `--total-frames` is fine): batches continue where it was taken.
    #[arg(long, value_name = "PATH")]
    resume: Option<PathBuf>,
    /// Supervise the nodes: restart a failed node (local: rebuilt; process: respawned;
    /// slurm: its task resubmitted; external: its slot waits for a rejoin) up to N times
    /// within 5 s [default: off, a lost node stays lost].
    #[arg(long, value_name = "N")]
    node_max_restarts: Option<u32>,
    /// Run env worker threads N nice levels below the rest of their process (0..=19;
    /// 0: the same), so the trainer and the nodes' connections run first on busy cores.
    #[arg(long, value_name = "N", default_value_t = rollout::node_spec::DEFAULT_WORKER_NICE)]
    worker_nice: i32,
    #[command(flatten)]
    slurm: SlurmArgs,
    /// One JSON object per batch on stdout, then a summary object.
    #[arg(long)]
    json: bool,
    /// Append every batch to FILE as MessagePack (see the format in the crate docs).
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// The options of `--launcher slurm`; each maps to the sbatch option of the same name.
#[derive(Args, Debug)]
#[command(next_help_heading = "SLURM (--launcher slurm)")]
struct SlurmArgs {
    /// The address the SLURM tasks dial, HOST[:PORT] (required; without a port, the one
    /// `--listen` bound). `--listen` must be reachable from the compute nodes, e.g. 0.0.0.0:0.
    #[arg(long, value_name = "ADDR")]
    advertise: Option<String>,
    /// sbatch --partition [default: the cluster's default].
    #[arg(long, value_name = "P")]
    partition: Option<String>,
    /// sbatch --time, e.g. 1:00:00 [default: the partition's].
    #[arg(long, value_name = "T")]
    time: Option<String>,
    /// sbatch --cpus-per-task [default: SLURM's, 1].
    #[arg(long, value_name = "C")]
    cpus_per_task: Option<u32>,
    /// sbatch --mem, e.g. 4G [default: the partition's].
    #[arg(long, value_name = "M")]
    mem: Option<String>,
    /// One more `#SBATCH` line for the batch script, e.g. '--qos=high' (repeatable).
    #[arg(long, value_name = "LINE", allow_hyphen_values = true)]
    sbatch_line: Vec<String>,
    /// sbatch --job-name [default: rollout].
    #[arg(long, value_name = "N")]
    job_name: Option<String>,
    /// Folder for the batch script, the token file (0600) and the tasks' logs; must be
    /// shared with the compute nodes [default: ./rollout-slurm].
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
}

impl SlurmArgs {
    /// The launcher's options; an error names a flag given without `--launcher slurm`.
    fn options(&self, slurm: bool) -> Result<Option<SlurmOptions>, Failure> {
        let given = [
            ("advertise", self.advertise.is_some()),
            ("partition", self.partition.is_some()),
            ("time", self.time.is_some()),
            ("cpus_per_task", self.cpus_per_task.is_some()),
            ("mem", self.mem.is_some()),
            ("sbatch_line", !self.sbatch_line.is_empty()),
            ("job_name", self.job_name.is_some()),
            ("output_dir", self.output_dir.is_some()),
        ];
        if !slurm {
            return match given.iter().find(|(_, on)| *on) {
                Some((field, _)) => Err(usage(field, "only used by `--launcher slurm`")),
                None => Ok(None),
            };
        }
        let d = SlurmOptions::default();
        Ok(Some(SlurmOptions {
            partition: self.partition.clone(),
            time: self.time.clone(),
            cpus_per_task: self.cpus_per_task,
            mem: self.mem.clone(),
            extra_lines: self.sbatch_line.clone(),
            job_name: self.job_name.clone().unwrap_or(d.job_name),
            output_dir: self.output_dir.clone().unwrap_or(d.output_dir),
        }))
    }
}

/// A failure and the exit status it maps to.
enum Failure {
    /// Bad flags or values: exit 2.
    Usage(String),
    /// Failed after the start: exit 1.
    Runtime(String),
}

fn usage(field: &str, reason: impl std::fmt::Display) -> Failure {
    Failure::Usage(format!("invalid `{field}`: {reason}"))
}

/// A build error: a config the collector refused (exit 2) or a failure to start (exit 1).
fn build_failure(e: CollectError) -> Failure {
    match e {
        // A checkpoint refused at build time does not fit the flags: bad input too.
        CollectError::Config(_)
        | CollectError::Env(_)
        | CollectError::NodeBuild { .. }
        | CollectError::Checkpoint(_) => Failure::Usage(e.to_string()),
        other => Failure::Runtime(other.to_string()),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help, --version, and the help shown when no subcommand is given.
        Err(e) if !e.use_stderr() || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
        Err(e) => {
            eprintln!("{}", one_line(&e.render().to_string()));
            return ExitCode::from(2);
        }
    };
    init_tracing();
    let result = match cli.command {
        Command::Collect(args) => collect(&args),
        Command::Node(args) => node(&args),
        Command::Train(args) => train_cmd::train(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("error: {}", one_line(&m));
            ExitCode::from(2)
        }
        Err(Failure::Runtime(m)) => {
            eprintln!("error: {}", one_line(&m));
            ExitCode::from(1)
        }
    }
}

/// Folds a possibly multi-line message (clap's usage errors) into one line, dropping clap's
/// `Usage:` and `For more information` trailers.
fn one_line(s: &str) -> String {
    let mut out = String::new();
    for line in s.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            continue;
        }
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
        }
        out.push_str(line);
    }
    out
}

fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .try_init();
}

fn policy_config(args: &CollectArgs) -> Result<PolicyConfig, Failure> {
    if args.hidden.is_some() && args.policy != PolicyKind::Mlp {
        return Err(usage("hidden", "only used by `--policy mlp`"));
    }
    if args.value.is_some() && args.policy != PolicyKind::Constant {
        return Err(usage("value", "only used by `--policy constant`"));
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
    })
}

fn build(args: &CollectArgs, resume: Option<rollout::checkpoint::Checkpoint>) -> Result<DistributedCollector, Failure> {
    let config = match &args.env_config {
        None => serde_json::Value::Null,
        Some(s) => serde_json::from_str(s).map_err(|e| usage("env_config", format!("not valid JSON: {e}")))?,
    };
    let env = EnvSpec {
        name: args.env.clone(),
        config,
    };
    let batch_timeout = Duration::try_from_secs_f64(args.batch_timeout).map_err(|_| {
        usage(
            "batch_timeout",
            format!("{} is not a number of seconds", args.batch_timeout),
        )
    })?;
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
    let mut b = DistributedCollector::builder()
        .env(env)
        .policy(policy_config(args)?)
        .nodes(args.nodes)
        .envs_per_node(args.envs_per_node)
        .frames_per_batch(args.frames_per_batch)
        .total_frames(args.total_frames)
        .sync(args.sync)
        .launcher(launcher.clone())
        .update_after_each_batch(args.update_after_each_batch)
        .init_random_frames(args.init_random_frames)
        .reset_at_each_iter(args.reset_at_each_iter)
        .split_trajs(args.split_trajs)
        .batch_timeout(batch_timeout);
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
    if let Some(n) = args.node_max_restarts {
        b = b.node_max_restarts(n);
    }
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
    if let Some(addr) = &args.slurm.advertise {
        b = b.advertise(addr.clone());
    }
    if launcher != Launcher::Local {
        match read_token(args.token_file.as_deref()) {
            Ok(t) => b = b.token(t),
            Err(JoinError::NoToken) if matches!(launcher, Launcher::Process | Launcher::Slurm(_)) => {}
            Err(e) => return Err(usage("token", e)),
        }
    }
    if let Some(ck) = resume {
        b = b.resume(ck);
    }
    let c = b.build().map_err(build_failure)?;
    if let (Launcher::External, Some(addr)) = (&launcher, c.listen_addr()) {
        eprintln!("listening on {addr}");
    }
    if let Some(job) = c.slurm_job_id() {
        eprintln!("SLURM job {job}: every node joined");
    }
    Ok(c)
}

/// `rollout node`: join, serve until Shutdown, exit 0.
fn node(args: &NodeArgs) -> Result<(), Failure> {
    let token = read_token(args.token_file.as_deref()).map_err(|e| usage("token", e))?;
    let connect_timeout = Duration::try_from_secs_f64(args.connect_timeout).map_err(|_| {
        usage(
            "connect_timeout",
            format!("{} is not a number of seconds", args.connect_timeout),
        )
    })?;
    let mut opts = NodeOptions {
        index: args.index,
        connect_timeout,
        ..NodeOptions::default()
    };
    if let Some(n) = &args.name {
        opts.name = n.clone();
    }
    run_node(&args.join, &token, opts).map_err(|e| match e {
        JoinError::Connect { .. } | JoinError::Rejected(_) => Failure::Runtime(e.to_string()),
        other => Failure::Runtime(other.to_string()),
    })
}

/// The `data` map of an output record: every tensor under its dotted key.
struct Data<'a>(&'a TensorDict);

impl Serialize for Data<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, t) in self.0.iter() {
            m.serialize_entry(k, t)?;
        }
        m.end()
    }
}

/// One batch as written by `--output`.
#[derive(Serialize)]
struct Record<'a> {
    batch: u64,
    node: Option<usize>,
    weights_version: u64,
    data: Data<'a>,
}

/// One `--json` line per batch.
#[derive(Serialize)]
struct BatchLine {
    batch: u64,
    frames: u64,
    node: Option<usize>,
    weights_version: u64,
}

/// The last `--json` line.
#[derive(Serialize)]
struct Summary {
    frames: u64,
    batches: u64,
    seconds: f64,
    fps: f64,
}

/// Real frames of a batch: the `collector.mask` count after `--split-trajs`, else every frame.
fn frames_of(data: &TensorDict) -> u64 {
    match data.get(keys::MASK) {
        Ok(Tensor::Bool(m)) => m.iter().filter(|&&b| b).count() as u64,
        _ => data.numel() as u64,
    }
}

fn progress_bar(args: &CollectArgs) -> ProgressBar {
    if args.quiet || !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (pb, template) = if args.total_frames >= 0 {
        (
            ProgressBar::with_draw_target(Some(args.total_frames as u64), ProgressDrawTarget::stderr()),
            "{elapsed_precise} [{wide_bar}] {human_pos}/{human_len} frames, {msg}",
        )
    } else {
        (
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            "{elapsed_precise} {spinner} {human_pos} frames, {msg}",
        )
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message("0 batches");
    pb
}

fn collect(args: &CollectArgs) -> Result<(), Failure> {
    if args.checkpoint_every == 0 {
        return Err(usage("checkpoint_every", "must be at least 1"));
    }
    let resumed = match &args.resume {
        Some(p) => Some(resume::CollectCheckpoint::load(p).map_err(|e| usage("resume", format!("{e:#}")))?),
        None => None,
    };
    // Open the output before starting anything: a path we cannot write is a bad value.
    let mut output = match (&args.output, resumed.as_ref().and_then(|r| r.output_len)) {
        (None, _) => None,
        (Some(p), Some(len)) => Some(BufWriter::new(
            resume::reopen_output(p, len).map_err(|e| usage("output", format!("{e:#}")))?,
        )),
        (Some(p), None) => {
            Some(BufWriter::new(File::create(p).map_err(|e| {
                usage("output", format!("cannot create {}: {e}", p.display()))
            })?))
        }
    };
    let before = resumed.as_ref().map_or(0, |r| r.collector.trainer.frames_yielded);
    let mut collector = build(args, resumed.map(|r| r.collector))?;
    let pb = progress_bar(args);
    pb.set_position(before);
    let run = run(args, &mut collector, output.as_mut(), &pb);
    pb.finish_and_clear();
    let flushed = match output.as_mut() {
        Some(w) => w.flush().context("writing the output file"),
        None => Ok(()),
    };
    let down = collector.shutdown();
    let (frames, batches, seconds) = run.map_err(|e| Failure::Runtime(format!("{e:#}")))?;
    flushed.map_err(|e| Failure::Runtime(format!("{e:#}")))?;
    down.map_err(|e| Failure::Runtime(format!("shutting down: {e}")))?;
    let fps = if seconds > 0.0 { frames as f64 / seconds } else { 0.0 };
    if args.json {
        let summary = Summary {
            frames,
            batches,
            seconds,
            fps,
        };
        let summary = serde_json::to_string(&summary).map_err(|e| Failure::Runtime(e.to_string()))?;
        let mut out = io::stdout().lock();
        writeln!(out, "{summary}")
            .and_then(|()| out.flush())
            .map_err(|e| Failure::Runtime(format!("writing stdout: {e}")))?;
    } else {
        eprintln!("collected {frames} frames in {batches} batches in {seconds:.2} s ({fps:.0} frames/s)");
    }
    Ok(())
}

/// Collects until the collector is done; returns (frames, batches, seconds).
fn run(
    args: &CollectArgs,
    collector: &mut DistributedCollector,
    mut output: Option<&mut BufWriter<File>>,
    pb: &ProgressBar,
) -> anyhow::Result<(u64, u64, f64)> {
    let start = Instant::now();
    let (mut frames, mut batches) = (0u64, 0u64);
    let mut stdout = io::stdout().lock();
    while let Some(c) = collector.next_batch()? {
        let Collected {
            index,
            node,
            weights_version,
            ref data,
            ..
        } = c;
        let n = frames_of(data);
        frames += n;
        batches += 1;
        if let Some(w) = output.as_deref_mut() {
            let record = Record {
                batch: index,
                node,
                weights_version,
                data: Data(data),
            };
            rmp_serde::encode::write_named(w, &record).with_context(|| format!("writing batch {index}"))?;
        }
        if args.json {
            let line = serde_json::to_string(&BatchLine {
                batch: index,
                frames: n,
                node,
                weights_version,
            })?;
            writeln!(stdout, "{line}")
                .and_then(|()| stdout.flush())
                .context("writing stdout")?;
        }
        if let Some(path) = &args.checkpoint {
            if batches.is_multiple_of(args.checkpoint_every) {
                // The file must hold exactly the batches the checkpoint has yielded.
                let output_len = match output.as_deref_mut() {
                    Some(w) => {
                        w.flush().context("writing the output file")?;
                        Some(w.get_mut().stream_position().context("reading the output position")?)
                    }
                    None => None,
                };
                let collector = collector.checkpoint().context("taking a checkpoint")?;
                resume::CollectCheckpoint { collector, output_len }
                    .save(path)
                    .context("saving the checkpoint")?;
            }
        }
        pb.inc(n);
        let secs = start.elapsed().as_secs_f64();
        let fps = if secs > 0.0 { frames as f64 / secs } else { 0.0 };
        pb.set_message(format!("{fps:.0} frames/s, {batches} batches"));
    }
    Ok((frames, batches, start.elapsed().as_secs_f64()))
}

/// `rollout train`: PPO on the nodes' batches until a target mean return (exit 0) or a frame
/// budget (exit 1). A progress bar on stderr (hidden with `--quiet` or when stderr is not a
/// terminal), then one summary line on stderr, or one JSON object on stdout with `--json`:
/// `{"reached": bool, "episodes": .., "frames": .., "batches": .., "seconds": .., "mean_return": ..,
/// "best_return": .., "weights_version": .., "returns": [..]}`.
mod train_cmd {
    use std::io::{self, IsTerminal, Write};
    use std::time::Duration;

    use clap::Args;
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    use rollout::learn::PpoConfig;
    use rollout::{EnvSpec, PolicyConfig};
    use rollout_actors::learner::{train as run_training, Flow, TrainConfig};
    use rollout_actors::Launcher;

    use super::{usage, Failure, LauncherKind};

    /// Flags of `rollout train`; the defaults solve CartPole-v1.
    #[derive(Args, Debug)]
    pub struct TrainArgs {
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
    pub fn train(args: &TrainArgs) -> Result<(), Failure> {
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
}
