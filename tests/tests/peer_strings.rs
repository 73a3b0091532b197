//! A token holder's words in the trainer's log, over real loopback sockets: a run of two
//! legitimate nodes and one scripted node (the wire encoder and the token on a raw
//! `TcpStream`) that floods the trainer with refusals and fails with a reason of
//! megabytes full of control characters. The run ends exact with the legitimate nodes,
//! and what the peer made the trainer log is at most 64 KiB: the reason cut to 256
//! bytes with its size, escaped, no forged line, the repeated refusals held back and
//! counted.

use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rollout::connection::LogBudget;
use rollout::message::{FromNode, ToNode};
use rollout::peer_text::MAX_PRINTED;
use rollout::wire::{NodeFrame, TrainerFrame};
use rollout::Registry;
use rollout_actors::DistributedCollector;
use rollout_tests::{
    built_on_a_thread, connect, external_counting_builder, good_node, logged_in, logs, poll_until, recv, send,
    unique_name,
};

const TOKEN: &[u8] = b"peer-strings-token-0123456789abc";
const DEADLINE: Duration = Duration::from_secs(30);
const FPB: usize = 1000;
const ENVS: usize = 2;
const TOTAL: usize = 4000;
/// The hostile node's index; the legitimate ones are 0 and 1.
const HOSTILE: usize = 2;
/// Refusals the hostile node sends, each a line of the trainer's log without a budget.
const REFUSALS: usize = 3000;

/// An async trainer expecting three external nodes of [`ENVS`] Counting envs each,
/// built on a thread (build waits for the joins).
fn trainer() -> (JoinHandle<DistributedCollector>, SocketAddr) {
    built_on_a_thread(
        external_counting_builder(TOKEN, 3, ENVS)
            .frames_per_batch(FPB)
            .total_frames(TOTAL as i64)
            .sync(false),
    )
}

/// The captured log from byte `from` on.
fn log_since(from: usize) -> String {
    let log = logs().lock().unwrap_or_else(|p| p.into_inner());
    String::from_utf8_lossy(log.get(from..).unwrap_or_default()).into_owned()
}

/// The lines of `text` about the hostile node: its slot or its name.
fn hostile_lines<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let (slot, named) = (format!("node={HOSTILE}"), format!("name={name}"));
    text.lines()
        .filter(|l| l.split_whitespace().any(|w| w == slot || w == named))
        .collect()
}

#[test]
fn a_peers_failed_reason_and_repeated_refusals_cost_the_log_at_most_64_kib() {
    let from = logs().lock().unwrap_or_else(|p| p.into_inner()).len();
    let (t, addr) = trainer();
    let name = unique_name("wordy");
    let mut s = connect(addr, DEADLINE);
    let welcome = logged_in(&mut s, TOKEN, &name, Some(HOSTILE));
    let env = Registry::with_builtins().make(&"Counting".into()).expect("builtin env");
    let layout = rollout::rollout::batch_layout(env.observation_spec(), env.action_spec());
    let node = welcome.node_index;
    send(
        &mut s,
        &NodeFrame::Message(FromNode::Ready {
            node,
            layout,
            specs: None,
        }),
    );
    let good = [good_node(addr, TOKEN, Some(0)), good_node(addr, TOKEN, Some(1))];
    let mut c = t.join().expect("trainer thread");

    // In the seeding chain like any node, then the words.
    loop {
        match recv(&mut s) {
            Some(TrainerFrame::Message(ToNode::Seed(seed))) => {
                let next_seed = seed.seed.wrapping_add(ENVS as u64);
                send(&mut s, &NodeFrame::Message(FromNode::Seeded { node, next_seed }));
                break;
            }
            Some(_) => {}
            None => panic!("the trainer closed the hostile node before seeding it"),
        }
    }
    // A restore nobody sent, refused again and again: each a dropped message, the node kept.
    let refusal = "\u{7}\n".repeat(512);
    for _ in 0..REFUSALS {
        send(
            &mut s,
            &NodeFrame::Message(FromNode::CheckpointFailed {
                node,
                id: 0,
                reason: refusal.clone(),
            }),
        );
    }
    // 4 MiB of a forged, coloured log line.
    let forged = "\u{1b}[31m\nERROR forged line\r\n";
    let reason = forged.repeat((4 << 20) / forged.len());
    send(
        &mut s,
        &NodeFrame::Message(FromNode::Failed {
            node,
            reason: reason.clone(),
        }),
    );
    // The trainer drops the node and closes its connection.
    while recv(&mut s).is_some() {}

    let mut frames = 0;
    let mut sources = Vec::new();
    while let Some(b) = c.next_batch().expect("batch") {
        frames += b.data.numel();
        sources.push(b.node);
    }
    c.shutdown().expect("shutdown");
    assert_eq!(frames, TOTAL, "the run ends exact");
    assert!(
        sources.iter().all(|n| matches!(n, Some(0 | 1))),
        "every batch from the legitimate nodes: {sources:?}"
    );
    for g in good {
        assert_eq!(g.join().expect("node thread"), Ok(()));
    }

    // The reason, as the trainer logged the node's loss: cut, escaped, with its size.
    let suffix = format!(" … ({} bytes)", reason.len());
    let end = Instant::now() + DEADLINE;
    let lost = poll_until(end, || {
        let text = log_since(from);
        hostile_lines(&text, &name)
            .into_iter()
            .find(|l| l.contains("node lost") && l.contains(&suffix))
            .map(str::to_string)
    });
    let Some(lost) = lost else {
        panic!("no `node lost` line with `{suffix}`:\n{}", log_since(from));
    };
    assert!(lost.contains("\\u{1b}[31m\\nERROR forged line\\r\\n"), "{lost}");
    assert!(lost.len() < 2 * MAX_PRINTED + 200, "{} bytes: {lost}", lost.len());
    let closed = poll_until(end, || {
        let text = log_since(from);
        hostile_lines(&text, &name)
            .into_iter()
            .find(|l| l.contains("held_back="))
            .map(str::to_string)
    });
    let Some(closed) = closed else {
        panic!("the held-back lines were never counted:\n{}", log_since(from));
    };

    let text = log_since(from);
    let lines = hostile_lines(&text, &name);
    let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    let dropped = lines.iter().filter(|l| l.contains("dropped a node message")).count();
    eprintln!(
        "the hostile connection: {} lines, {bytes} bytes of log; {dropped} of {REFUSALS} refusals logged; {closed}",
        lines.len()
    );
    assert!(
        bytes <= LogBudget::PER_CONNECTION,
        "{bytes} bytes of log about the hostile node"
    );
    assert!(dropped > 0 && dropped < REFUSALS, "{dropped} refusals logged");
    assert!(
        !text.contains(['\u{1b}', '\u{7}', '\r']),
        "a raw control character reached the log"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("ERROR forged")),
        "the peer forged a log line"
    );
}
