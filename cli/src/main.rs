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
//! * `130` (SIGINT, Ctrl-C) or `143` (SIGTERM): `rollout collect` was interrupted; the batch
//!   in flight was dropped, the batches before it written out, every node stopped between
//!   steps and the collector shut down as at the end of a run (a second signal exits at once).
//!
//! # `--json`
//!
//! One JSON object per line on stdout for every yielded batch,
//! `{"batch": i, "frames": n, "node": k|null, "weights_version": v, "policy_lag": l}` (`node` is
//! `null` for sync batches, which stack a share of every node; `frames` counts real frames,
//! padding excluded after `--split-trajs`; `policy_lag` the versions `v` was behind the stored
//! weights when the batch was yielded), then one summary object `{"frames": .., "batches": .., "seconds": .., "fps": ..}`.
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
//!   "weights_versions": [u64],    // each share's: every frame of async batch has [0]; frame
//!                                 // [n, ..] of a sync batch has [n]; a sync batch split with
//!                                 // --split-trajs has each frame's in "collector.weights_version"
//!   "policy_lag": u64,            // versions "weights_version" was behind the stored weights
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
//! into `struct { batch: u64, node: Option<usize>, weights_version: u64, weights_versions:
//! Vec<u64>, policy_lag: u64, data: BTreeMap<String, rollout::Tensor> }` with
//! `rmp_serde::decode::from_read` called repeatedly on one reader. A sync record split with
//! `--split-trajs` also holds `collector.weights_version`: each frame's version.

#![forbid(unsafe_code)]

// One module per subcommand (`collect` with its flags, their translation into a
// collector, its output records and checkpoints; `node`; `train`), and `failure`:
// how each maps to an exit status.
mod collect;
mod collect_args;
mod collect_build;
mod failure;
mod fd_limit;
mod interrupt;
mod node;
mod output;
mod resume;
#[cfg(feature = "learn")]
mod train;

use std::io::{self, IsTerminal};
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

use crate::collect_args::CollectArgs;
use crate::failure::Failure;
use crate::node::NodeArgs;
#[cfg(feature = "learn")]
use crate::train::TrainArgs;

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
    #[cfg(feature = "learn")]
    Train(Box<TrainArgs>),
}

/// `--launcher`: where the nodes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LauncherKind {
    /// Nodes on threads of this process.
    Local,
    /// Child processes of this binary joining over loopback.
    Process,
    /// Nodes started by anyone else with `rollout node --join` (see `--listen`).
    External,
    /// ONE sbatch job array of `--nodes` tasks (see `--advertise` and the SLURM options).
    Slurm,
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
    fd_limit::raise_nofile_limit();
    let result = match cli.command {
        Command::Collect(args) => collect::collect(&args),
        Command::Node(args) => node::node(&args),
        #[cfg(feature = "learn")]
        Command::Train(args) => train::train(&args),
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
        Err(Failure::Interrupted { signal, signo }) => {
            eprintln!("error: interrupted by {signal}");
            ExitCode::from(u8::try_from(128 + signo).unwrap_or(1))
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
    // tract warns, at every parse of an ONNX model, that an opset above 18 is untested;
    // the trainer checks the model before any node starts and a node that cannot run it
    // fails naming the op, so that warning only repeats itself.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,tract_onnx=error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .try_init();
}
