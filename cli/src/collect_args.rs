//! The flags of `rollout collect`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use rollout_actors::{CollectorArgs, SlurmOptions};

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

/// `rollout collect`'s flags: the collector's plain settings (shared with the Python
/// module, each documented once in `rollout_actors::CollectorArgs`), then what the
/// command line spells its own way.
#[derive(Args, Debug)]
pub(crate) struct CollectArgs {
    #[command(flatten)]
    pub(crate) run: CollectorArgs,
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
    /// (`loc` and `scale` or `log_std`), tanh_normal, deterministic (`action`), or
    /// qvalue (`action_value`: the greedy action of a Q-value actor).
    #[arg(long, value_name = "HEAD")]
    pub(crate) onnx_head: Option<String>,
    /// Action value of `--policy constant` [default: 1].
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub(crate) value: Option<f32>,
    /// Where the nodes run.
    #[arg(long, value_enum, default_value_t = LauncherKind::Local)]
    pub(crate) launcher: LauncherKind,
    /// The command that starts a node (`--launcher process` or `slurm`), split into words
    /// as a POSIX shell splits them (quotes honoured; no shell runs it), e.g.
    /// 'python -m rollout_node --import mymod'; the launcher appends `--join ADDR --index I
    /// --name NAME` and the token [default: this binary's `node` subcommand].
    #[arg(long, value_name = "COMMAND")]
    pub(crate) node_command: Option<String>,
    /// File holding the shared token for remote nodes (else ROLLOUT_TOKEN).
    #[arg(long, value_name = "PATH")]
    pub(crate) token_file: Option<PathBuf>,
    /// Accept a token file readable by group or others (refused by default, as ssh refuses such a key).
    #[arg(long)]
    pub(crate) allow_insecure_token_file: bool,
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

impl CollectArgs {
    /// `--total-frames` (always given: clap holds its default).
    pub(crate) fn total_frames(&self) -> i64 {
        self.run.total_frames.unwrap_or(-1)
    }
}

/// The options of `--launcher slurm`; each maps to the sbatch option of the same name.
#[derive(Args, Debug)]
#[command(next_help_heading = "SLURM (--launcher slurm)")]
pub(crate) struct SlurmArgs {
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
