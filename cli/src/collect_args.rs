//! The flags of `rollout collect`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use rollout_actors::SlurmOptions;

use crate::failure::{usage, Failure};
use crate::LauncherKind;

/// The policy kinds of `--policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PolicyKind {
    /// Uniform samples of the action spec.
    Random,
    /// One linear layer.
    Linear,
    /// Tanh hidden layers (see `--hidden`), then a linear output.
    Mlp,
    /// Every action is `--value`.
    Constant,
    /// A network exported as ONNX (`--policy-file`, `--onnx-head`).
    Onnx,
}

/// `--exploration-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Exploration {
    /// The mode of the action distribution.
    Deterministic,
    /// A sample of the action distribution.
    Random,
}

#[derive(Args, Debug)]
pub(crate) struct CollectArgs {
    /// Env name: one this binary builds (CartPole-v1, Pendulum-v1, MountainCarContinuous-v0,
    /// Counting), or, with nodes that join over TCP, any env the nodes build.
    #[arg(long, default_value = "CartPole-v1")]
    pub(crate) env: String,
    /// Env config as a JSON object, e.g. '{"max_episode_steps": 200}'.
    #[arg(long, value_name = "JSON")]
    pub(crate) env_config: Option<String>,
    /// The env's observation and action spaces, as JSON or @FILE holding JSON, e.g.
    /// '{"observation": {"kind": "box", "dtype": "f64", "shape": [17]}, "action": {"kind":
    /// "discrete", "n": 6}}': batches and the policy's weights are built from them up
    /// front, and every node must report the same. Without it, an env this trainer
    /// cannot build takes the specs of the first node to be ready (not with `--launcher
    /// local`).
    #[arg(long, value_name = "JSON|@FILE")]
    pub(crate) env_spec: Option<String>,
    /// Number of nodes (a fixed set) [default: 2].
    #[arg(long, value_name = "N")]
    pub(crate) nodes: Option<usize>,
    /// Elastic membership (async, `--launcher external`): at most N nodes at once; nodes
    /// join and leave while the run goes on (replaces `--nodes`).
    #[arg(long, value_name = "N")]
    pub(crate) max_nodes: Option<usize>,
    /// Elastic membership: nodes that must have joined before the run starts
    /// [default: 1]; needs `--max-nodes`.
    #[arg(long, value_name = "N")]
    pub(crate) min_nodes: Option<usize>,
    /// Envs per node (the rows of its batches).
    #[arg(long, default_value_t = 1, value_name = "E")]
    pub(crate) envs_per_node: usize,
    /// Envs each env worker (a thread) steps together, one policy call per step on their
    /// observations; must divide --envs-per-node.
    #[arg(long, default_value_t = 1, value_name = "K")]
    pub(crate) envs_per_worker: usize,
    /// Frames per yielded batch.
    #[arg(long, default_value_t = 1000, value_name = "F")]
    pub(crate) frames_per_batch: usize,
    /// Frames to collect in all; -1 collects until killed.
    #[arg(long, default_value_t = 10000, value_name = "T", allow_negative_numbers = true)]
    pub(crate) total_frames: i64,
    /// Sync collection (every batch stacks a share of every node); default async.
    #[arg(long)]
    pub(crate) sync: bool,
    /// Seed of the run (drawn from the clock when absent).
    #[arg(long, value_name = "S")]
    pub(crate) seed: Option<u64>,
    /// Policy.
    #[arg(long, value_enum, default_value_t = PolicyKind::Linear)]
    pub(crate) policy: PolicyKind,
    /// Hidden layer widths of `--policy mlp` [default: 64,64].
    #[arg(long, value_delimiter = ',', value_name = "W,W,..")]
    pub(crate) hidden: Option<Vec<usize>>,
    /// The `.onnx` file of `--policy onnx` (e.g. exported from PyTorch).
    #[arg(long, value_name = "PATH")]
    pub(crate) policy_file: Option<PathBuf>,
    /// How `--policy onnx`'s outputs give the action: categorical (`logits`), normal
    /// (`loc` and `scale` or `log_std`), tanh_normal, or deterministic (`action`).
    #[arg(long, value_name = "HEAD")]
    pub(crate) onnx_head: Option<String>,
    /// Action value of `--policy constant` [default: 1].
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub(crate) value: Option<f32>,
    /// Deterministic (mode) or random (sampled) actions.
    #[arg(long, value_enum)]
    pub(crate) exploration_type: Option<Exploration>,
    /// Where the nodes run.
    #[arg(long, value_enum, default_value_t = LauncherKind::Local)]
    pub(crate) launcher: LauncherKind,
    /// The command that starts a node (`--launcher process` or `slurm`), split into words
    /// as a POSIX shell splits them (quotes honoured; no shell runs it), e.g.
    /// 'python -m rollout_node --import mymod'; the launcher appends `--join ADDR --index I
    /// --name NAME` and the token [default: this binary's `node` subcommand].
    #[arg(long, value_name = "COMMAND")]
    pub(crate) node_command: Option<String>,
    /// Push stored weights before each collection.
    #[arg(long)]
    pub(crate) update_after_each_batch: bool,
    /// Update a node that produced more than N batches since its last update.
    #[arg(long, value_name = "N")]
    pub(crate) max_weight_update_interval: Option<u64>,
    /// Push stored weights to all nodes every N yielded batches.
    #[arg(long, value_name = "N")]
    pub(crate) update_interval: Option<u64>,
    /// Truncate trajectories longer than N frames.
    #[arg(long, value_name = "N")]
    pub(crate) max_frames_per_traj: Option<u64>,
    /// Frames stepped with a random policy first.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) init_random_frames: u64,
    /// Start each batch with fresh episodes.
    #[arg(long)]
    pub(crate) reset_at_each_iter: bool,
    /// Yield batches split into trajectories ([n_traj, max_len] with `collector.mask`).
    #[arg(long)]
    pub(crate) split_trajs: bool,
    /// Address remote nodes join [default: 127.0.0.1:0]; setting it implies
    /// `--launcher external` unless another remote launcher is given.
    #[arg(long, value_name = "ADDR")]
    pub(crate) listen: Option<String>,
    /// Serve the run's metrics for Prometheus at http://ADDR/metrics (e.g. 127.0.0.1:9464;
    /// port 0 picks one, printed on stderr and, with `--json`, as `{"metrics": ADDR}`).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<String>,
    /// At the end, wait up to SECS for one more scrape of `--metrics`, so the scraper
    /// records the final values.
    #[arg(long, default_value_t = 0.0, value_name = "SECS")]
    pub(crate) metrics_linger: f64,
    /// File holding the shared token for remote nodes (else ROLLOUT_TOKEN).
    #[arg(long, value_name = "PATH")]
    pub(crate) token_file: Option<PathBuf>,
    /// Accept a token file readable by group or others (refused by default, as ssh refuses such a key).
    #[arg(long)]
    pub(crate) allow_insecure_token_file: bool,
    /// Longest wait for remote nodes to join, in seconds (elastic: for `--min-nodes`, and
    /// for a joiner once no node is left).
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    pub(crate) join_timeout: f64,
    /// Seconds between heartbeats on a remote node's connection (both ways).
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    pub(crate) heartbeat: f64,
    /// Seconds of silence after which a remote node (or, on its side, the trainer) is gone;
    /// above `--heartbeat`.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    pub(crate) heartbeat_timeout: f64,
    /// Longest wait for one batch, in seconds [default: 60, or twice the longest deadline
    /// on a node's answer set below, if more]; each of those must be at most half of it.
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub(crate) batch_timeout: Option<f64>,
    /// Save a checkpoint to PATH every `--checkpoint-every` batches (with the length of the
    /// `--output` file, which a resumed run cuts back to it).
    #[arg(long, value_name = "PATH")]
    pub(crate) checkpoint: Option<PathBuf>,
    /// Batches between two checkpoints.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub(crate) checkpoint_every: u64,
    /// Go on from a checkpoint written by `--checkpoint` (same flags otherwise; a larger
    /// `--total-frames` is fine): batches continue where it was taken.
    #[arg(long, value_name = "PATH")]
    pub(crate) resume: Option<PathBuf>,
    /// Supervise the nodes: restart a failed node (local: rebuilt; process: respawned;
    /// slurm: its task resubmitted; external: its slot waits for a rejoin) up to N times
    /// within `--node-restart-window`; 0 turns supervision off (a lost node stays lost)
    /// [default: 3 for the process, slurm and external launchers; off for local].
    #[arg(long, value_name = "N")]
    pub(crate) node_max_restarts: Option<u32>,
    /// The window `--node-max-restarts` counts in, in seconds.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    pub(crate) node_restart_window: f64,
    /// How long a node may take to answer `seed`, `update_weights`, `snapshot` and
    /// `restore`, in seconds; past it the node fails (restarted under supervision,
    /// else dropped). The flags below set one apart [default: 30, or half of
    /// `--batch-timeout` if shorter].
    #[arg(long, value_name = "SECS")]
    pub(crate) request_timeout: Option<f64>,
    /// How long a node may take to answer `seed` [default: --request-timeout].
    #[arg(long, value_name = "SECS")]
    pub(crate) seed_timeout: Option<f64>,
    /// How long a node may take to answer `update_weights` [default: --request-timeout].
    #[arg(long, value_name = "SECS")]
    pub(crate) update_weights_timeout: Option<f64>,
    /// How long a node may take to answer `snapshot` or `restore` [default: --request-timeout].
    #[arg(long, value_name = "SECS")]
    pub(crate) snapshot_timeout: Option<f64>,
    /// How long a node may leave a `continue` unanswered [default: no limit;
    /// `--batch-timeout` bounds the wait for a batch].
    #[arg(long, value_name = "SECS")]
    pub(crate) continue_timeout: Option<f64>,
    /// How long a node may take to acknowledge `shutdown` once every frame is yielded;
    /// past it the node is closed with a warning and the run still succeeds.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    pub(crate) shutdown_ack_timeout: f64,
    /// Run env worker threads N nice levels below the rest of their process (0..=19;
    /// 0: the same), so the trainer and the nodes' connections run first on busy cores.
    #[arg(long, value_name = "N", default_value_t = rollout::node_spec::DEFAULT_WORKER_NICE)]
    pub(crate) worker_nice: i32,
    #[command(flatten)]
    pub(crate) slurm: SlurmArgs,
    /// One JSON object per batch on stdout, then a summary object.
    #[arg(long)]
    pub(crate) json: bool,
    /// Append every batch to FILE as MessagePack (see the format in the crate docs).
    #[arg(long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

/// The options of `--launcher slurm`; each maps to the sbatch option of the same name.
#[derive(Args, Debug)]
#[command(next_help_heading = "SLURM (--launcher slurm)")]
pub(crate) struct SlurmArgs {
    /// The address the SLURM tasks dial, HOST[:PORT] (required; without a port, the one
    /// `--listen` bound). `--listen` must be reachable from the compute nodes, e.g. 0.0.0.0:0.
    #[arg(long, value_name = "ADDR")]
    pub(crate) advertise: Option<String>,
    /// sbatch --partition [default: the cluster's default].
    #[arg(long, value_name = "P")]
    pub(crate) partition: Option<String>,
    /// sbatch --time, e.g. 1:00:00 [default: the partition's].
    #[arg(long, value_name = "T")]
    pub(crate) time: Option<String>,
    /// sbatch --cpus-per-task [default: SLURM's, 1].
    #[arg(long, value_name = "C")]
    pub(crate) cpus_per_task: Option<u32>,
    /// sbatch --mem, e.g. 4G [default: the partition's].
    #[arg(long, value_name = "M")]
    pub(crate) mem: Option<String>,
    /// One more `#SBATCH` line for the batch script, e.g. '--qos=high' (repeatable).
    #[arg(long, value_name = "LINE", allow_hyphen_values = true)]
    pub(crate) sbatch_line: Vec<String>,
    /// sbatch --job-name [default: rollout].
    #[arg(long, value_name = "N")]
    pub(crate) job_name: Option<String>,
    /// Folder for the batch script, the token file (0600) and the tasks' logs; must be
    /// shared with the compute nodes [default: ./rollout-slurm].
    #[arg(long, value_name = "DIR")]
    pub(crate) output_dir: Option<PathBuf>,
}

impl SlurmArgs {
    /// The launcher's options; an error names a flag given without `--launcher slurm`.
    pub(crate) fn options(&self, slurm: bool) -> Result<Option<SlurmOptions>, Failure> {
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
