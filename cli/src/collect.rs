//! `rollout collect`: build the collector from the flags, collect until done, write
//! the batches out, checkpoint on the way.

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Seek, Write};
use std::time::Instant;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rollout::{PolicyConfig, Weights};
use rollout_actors::{Collected, DistributedCollector};

use crate::collect_args::CollectArgs;
use crate::collect_build::{build, policy_config};
use crate::failure::{usage, Failure};
use crate::interrupt::Interrupt;
use crate::output::{frames_of, BatchLine, Data, Record, Summary};
use crate::resume;

fn progress_bar(args: &CollectArgs) -> ProgressBar {
    if args.quiet || !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (pb, template) = if let Ok(total) = u64::try_from(args.total_frames()) {
        (
            ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()),
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

pub(crate) fn collect(args: &CollectArgs) -> Result<(), Failure> {
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
    let policy = policy_config(args, resumed.as_ref().and_then(|r| r.policy.as_ref()))?;
    // Ctrl-C or SIGTERM ends the run as its end does: the collector shut down, the nodes
    // stopped between steps, instead of the process dying with a batch in flight. Caught
    // from before the build: node processes do not get the terminal's SIGINT (process
    // groups of their own), so this process stops them, also when the signal comes while
    // they start.
    let interrupt =
        Interrupt::catch().map_err(|e| Failure::Runtime(format!("cannot handle SIGINT and SIGTERM: {e}")))?;
    let mut collector = match build(args, resumed.map(|r| r.collector), policy.clone()) {
        Ok(c) => c,
        // A build that failed after a signal: the signal is what the user did.
        Err(failure) => {
            return Err(match interrupt.caught() {
                Some((signal, signo)) => Failure::Interrupted { signal, signo },
                None => failure,
            })
        }
    };
    interrupt.attach(collector.handle());
    let pb = progress_bar(args);
    pb.set_position(before);
    let run = run(args, &policy, &mut collector, output.as_mut(), &pb, &interrupt);
    interrupt.finish();
    pb.finish_and_clear();
    let flushed = match output.as_mut() {
        Some(w) => w.flush().context("writing the output file"),
        None => Ok(()),
    };
    let down = collector.shutdown();
    if let Some((signal, signo)) = interrupt.caught() {
        // What the run or the shutdown then said follows from the interruption.
        if let Err(e) = &run {
            tracing::debug!(error = %format!("{e:#}"), "after {signal}");
        }
        flushed.map_err(|e| Failure::Runtime(format!("{e:#}")))?;
        down.map_err(|e| Failure::Runtime(format!("shutting down after {signal}: {e}")))?;
        return Err(Failure::Interrupted { signal, signo });
    }
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

/// Collects until the collector is done or `interrupt` caught a signal; returns (frames,
/// batches, seconds).
fn run(
    args: &CollectArgs,
    policy: &PolicyConfig,
    collector: &mut DistributedCollector,
    mut output: Option<&mut BufWriter<File>>,
    pb: &ProgressBar,
    interrupt: &Interrupt,
) -> anyhow::Result<(u64, u64, f64)> {
    let start = Instant::now();
    let (mut frames, mut batches) = (0u64, 0u64);
    let mut stdout = io::stdout().lock();
    while interrupt.caught().is_none() {
        // An interrupted wait ends with `None` too.
        let Some(c) = collector.next_batch()? else {
            break;
        };
        let Collected {
            index,
            node,
            weights_version,
            ref weights_versions,
            policy_lag,
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
                weights_versions,
                policy_lag,
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
                policy_lag,
            })?;
            writeln!(stdout, "{line}")
                .and_then(|()| stdout.flush())
                .context("writing stdout")?;
        }
        if renews_weights(args) {
            // Before the checkpoint, so that a resumed run pushes what this one would.
            renew_weights(collector)?;
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
                // An ONNX model is not in the collector's checkpoint (its weights are):
                // the file keeps it, so a resumed run needs no `--policy-file`.
                let policy = matches!(policy, PolicyConfig::Onnx { .. }).then(|| policy.clone());
                resume::CollectCheckpoint {
                    collector,
                    output_len,
                    policy,
                }
                .save(path)
                .context("saving the checkpoint")?;
            }
        }
        pb.inc(n);
        let secs = start.elapsed().as_secs_f64();
        let fps = if secs > 0.0 { frames as f64 / secs } else { 0.0 };
        pb.set_message(format!("{fps:.0} frames/s, {batches} batches"));
        // Written out: its storage is collected into again instead of fresh pages.
        collector.recycle(c);
    }
    Ok((frames, batches, start.elapsed().as_secs_f64()))
}

/// Whether the run stands in for a learner that updates the policy after every batch:
/// any of the update options asks for pushes, and there must be something new to push;
/// a lag cap has nothing to cap without new versions.
fn renews_weights(args: &CollectArgs) -> bool {
    args.run.update_after_each_batch
        || args.run.update_interval.is_some()
        || args.run.max_weight_update_interval.is_some()
        || args.run.max_policy_lag.is_some()
}

/// Stores the trainer's current weights again, as the next version: `rollout collect`
/// has no learner, so this is its update after a batch. The update options then decide
/// when the nodes get it (`--update-after-each-batch` before each node's next batch,
/// `--update-interval N` every N batches), and the batches' `weights_version` says
/// which version each was collected with.
fn renew_weights(collector: &mut DistributedCollector) -> anyhow::Result<()> {
    let current = collector
        .policy_weights(0)
        .context("reading the trainer's weights")?
        .context("the trainer holds no weights for node 0")?;
    collector
        .set_policy_weights(Weights::clone(&current))
        .context("storing the weights")?;
    Ok(())
}
