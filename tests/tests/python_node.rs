//! Python nodes (python/node, run with the venv scripts/test.sh makes) mixed with Rust nodes
//! in real runs of `rollout collect --launcher external`: sync and async, CartPole-v1 and
//! Pendulum-v1, two env workers per node. Every run's `--output` replays through gymnasium,
//! and in deterministic mode every frame's action is what both implementations compute for
//! its observation with the run's weights. And a Python node leaving an elastic run on
//! SIGTERM (`leave`) as the Rust node does.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use rollout::policy::ActionsMut;
use rollout::{EnvSpec, ExplorationType, PolicyConfig, PolicySpec, Registry, Tensor};
use rollout_tests::{
    assert_recurrent_replay, listening_on_a_thread, read_output, rollout_bin, run_bounded, signal, temp_dir,
    venv_python, OutputRecord, Running,
};
use tempfile::TempDir;

const DEADLINE: Duration = Duration::from_secs(240);

/// Which implementation a node of a run is.
#[derive(Clone, Copy, Debug)]
enum Node {
    Python,
    Rust,
}

/// Runs `rollout collect` with `flags` and one node of each kind in `nodes`, all joining
/// over loopback; returns the `--output` file once every process exited 0.
fn mixed_run(py: &Path, dir: &TempDir, env: &str, sync: bool, flags: &[&str], nodes: &[Node]) -> PathBuf {
    let token = dir.path().join("token");
    std::fs::write(&token, "python-node-test-token\n").expect("write the token");
    // Readable by its owner only: the trainer and both kinds of node refuse it otherwise.
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod the token");
    let out = dir.path().join("out.msgpack");
    let mut collect = Command::new(rollout_bin());
    collect
        .args([
            "collect",
            "--launcher",
            "external",
            "--listen",
            "127.0.0.1:0",
            "--env",
            env,
            "--quiet",
        ])
        .args([
            "--envs-per-node",
            "2",
            "--seed",
            "11",
            "--nodes",
            &nodes.len().to_string(),
        ])
        .arg("--token-file")
        .arg(&token)
        .arg("--output")
        .arg(&out)
        .args(flags);
    if sync {
        collect.arg("--sync");
    }
    let mut trainer = Running::spawn(&mut collect).expect("start rollout collect");
    let addr = trainer.listening_addr(DEADLINE).to_string();
    let joined: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let mut cmd = match kind {
                Node::Python => {
                    let mut c = Command::new(py);
                    c.args(["-m", "rollout_node"]);
                    c
                }
                Node::Rust => {
                    let mut c = Command::new(rollout_bin());
                    c.arg("node");
                    c
                }
            };
            cmd.args([
                "--join",
                &addr,
                "--name",
                &format!("{kind:?}-{i}"),
                "--connect-timeout",
                "120",
            ])
            .arg("--token-file")
            .arg(&token);
            (
                *kind,
                thread::spawn(move || run_bounded(&mut cmd, DEADLINE).expect("start a node")),
            )
        })
        .collect();
    let trainer = trainer.finish(DEADLINE);
    for (kind, node) in joined {
        node.join()
            .expect("a node's thread")
            .assert_success(&format!("a {kind:?} node"));
    }
    trainer.assert_success("rollout collect");
    out
}

/// Runs the gymnasium replay checker on `out` (and the action check when `weights` is given).
fn replay(py: &Path, out: &Path, env: &str, weights: Option<(&Path, &str)>) {
    let mut cmd = Command::new(py);
    cmd.args(["-m", "rollout_node.replay"]).arg(out).args(["--env", env]);
    if let Some((w, policy)) = weights {
        cmd.arg("--weights").arg(w).args(["--policy", policy]);
    }
    let f = run_bounded(&mut cmd, DEADLINE).expect("start the replay checker");
    f.assert_success("the gymnasium replay");
}

/// Every record of an async run names one of the run's `nodes` nodes. Async does not
/// promise every node a batch: batches are yielded first ready, first served, and a node
/// slow to start (a loaded machine) may deliver none before `total_frames` are in.
fn assert_records_name_nodes_of_the_run(records: &[OutputRecord], nodes: usize) {
    assert!(!records.is_empty(), "no records");
    for r in records {
        assert!(
            r.node.is_some_and(|n| n < nodes),
            "batch {}: node {:?} of a run of {nodes}",
            r.batch,
            r.node
        );
    }
}

const NODES: [Node; 3] = [Node::Python, Node::Rust, Node::Python];

/// A run of `NODES` with the random policy and `extra` flags, checked and replayed.
fn random_run(env: &str, sync: bool, extra: &[&str]) {
    let Some(py) = venv_python() else { return };
    let dir = temp_dir(&format!("pynode-{env}-{sync}"));
    let mut flags = vec![
        "--policy",
        "random",
        "--frames-per-batch",
        "60",
        "--total-frames",
        "1200",
        "--max-frames-per-traj",
        "25",
    ];
    flags.extend_from_slice(extra);
    let out = mixed_run(&py, &dir, env, sync, &flags, &NODES);
    let records = read_output(&out);
    let frames: usize = records.iter().map(|r| r.data["collector.traj_ids"].len()).sum();
    assert_eq!(frames, 1200);
    if sync {
        assert!(records
            .iter()
            .all(|r| r.node.is_none() && r.data["observation"].shape()[..2] == [3, 2]));
        // Lanes: row (node n, worker w) hands out the ids n*E + w, + lanes, ... whichever
        // implementation the node is.
        for r in &records {
            let Tensor::I64(ids) = &r.data["collector.traj_ids"] else {
                panic!("traj ids are not i64");
            };
            for (i, &id) in ids.indexed_iter() {
                let (n, w) = (i[0], i[1]);
                assert_eq!(
                    id % 6,
                    (n * 2 + w) as i64,
                    "batch {}: node {n} worker {w} has id {id}",
                    r.batch
                );
            }
        }
    } else {
        assert_records_name_nodes_of_the_run(&records, NODES.len());
    }
    replay(&py, &out, env, None);
}

#[test]
fn mixed_async_cartpole_replays_through_gymnasium() {
    random_run("CartPole-v1", false, &[]);
}

#[test]
fn mixed_sync_cartpole_replays_through_gymnasium() {
    random_run("CartPole-v1", true, &[]);
}

/// Prefetch: each node is sent its next `continue` while it collects one (version
/// 11) and queues it; both kinds answer in order, and every frame replays.
#[test]
fn a_prefetching_async_run_of_python_and_rust_nodes_replays_through_gymnasium() {
    random_run("CartPole-v1", false, &["--prefetch", "1"]);
}

#[test]
fn mixed_async_pendulum_replays_through_gymnasium() {
    random_run("Pendulum-v1", false, &[]);
}

#[test]
fn mixed_sync_pendulum_replays_through_gymnasium() {
    random_run("Pendulum-v1", true, &[]);
}

/// A deterministic linear run of `nodes`: the trainer's version-0 weights (init seed 0)
/// drive every node; every recorded action must be the Rust policy's for its observation
/// (checked here) and the Python policy's (checked by the replay's action check), whichever
/// node took it. Async records come from whichever nodes were first ready, so with one node
/// every record is that node's.
fn deterministic_run(env: &str, sync: bool, nodes: &[Node]) {
    let Some(py) = venv_python() else { return };
    let kinds: Vec<String> = nodes.iter().map(|n| format!("{n:?}")).collect();
    let dir = temp_dir(&format!("pynode-det-{env}-{sync}-{}", kinds.join("-")));
    let flags = [
        "--policy",
        "linear",
        "--exploration-type",
        "deterministic",
        // The tests check what the policy records: recorded on request.
        "--record",
        "true",
        "--frames-per-batch",
        "60",
        "--total-frames",
        "600",
    ];
    let out = mixed_run(&py, &dir, env, sync, &flags, nodes);
    let records = read_output(&out);
    if !sync {
        assert_records_name_nodes_of_the_run(&records, nodes.len());
    }
    let spec = PolicySpec {
        config: PolicyConfig::Linear,
        exploration: ExplorationType::Deterministic,
        init_seed: 0,
        record: true,
    };
    let e = Registry::with_builtins()
        .make(&EnvSpec::from(env))
        .expect("a built-in env");
    let mut policy = spec
        .build(e.observation_spec(), e.action_spec(), 0)
        .expect("the policy");
    assert!(records.iter().all(|r| r.weights_version == 0), "no update was pushed");
    let d = e.observation_spec().dim();
    let mut frames = 0;
    for r in &records {
        let (Tensor::F32(obs), action) = (&r.data["observation"], &r.data["action"]) else {
            panic!("observation is not f32");
        };
        let obs: Vec<f32> = obs.iter().copied().collect();
        let k = obs.len() / d;
        frames += k;
        match action {
            Tensor::I64(recorded) => {
                let mut mine = vec![0i64; k];
                policy.act(&obs, k, ActionsMut::Discrete(&mut mine)).expect("act");
                assert_eq!(recorded.iter().copied().collect::<Vec<_>>(), mine, "batch {}", r.batch);
            }
            Tensor::F32(recorded) => {
                let mut mine = vec![0f32; recorded.len()];
                policy.act(&obs, k, ActionsMut::Continuous(&mut mine)).expect("act");
                let recorded: Vec<u32> = recorded.iter().map(|v| v.to_bits()).collect();
                let mine: Vec<u32> = mine.iter().map(|v| v.to_bits()).collect();
                assert_eq!(recorded, mine, "batch {}: the bits of every action", r.batch);
            }
            other => panic!("action of dtype {}", other.dtype()),
        }
        assert_records_are_the_policys(r, &mut *policy, &obs, k);
    }
    assert_eq!(frames, 600);
    let weights = dir.path().join("weights.msgpack");
    std::fs::write(
        &weights,
        rmp_serde::to_vec_named(policy.weights()).expect("encode the weights"),
    )
    .expect("write");
    let policy_json = r#"{"config": {"kind": "linear"}, "exploration": "deterministic", "init_seed": 0}"#;
    replay(&py, &out, env, Some((&weights, policy_json)));
    replay(&py, &out, env, None);
}

/// The f32 values of `key` in record `r`.
fn f32s(r: &OutputRecord, key: &str) -> Vec<f32> {
    match r.data.get(key) {
        Some(Tensor::F32(a)) => a.iter().copied().collect(),
        other => panic!("batch {}: `{key}` is {other:?}", r.batch),
    }
}

/// What record `r`'s node recorded beside its actions is what `policy` (the run's, with
/// its weights) records for the same observations and actions: the logits or loc and scale
/// to the bit (the forward pass is the same), the log-probabilities within 1e-5 (the
/// Python node's f64 `exp` and `ln` are numpy's), and consistent with the logits or the
/// normal and the recorded action by an independent computation.
fn assert_records_are_the_policys(r: &OutputRecord, policy: &mut dyn rollout::Policy, obs: &[f32], k: usize) {
    let lp = f32s(r, "action_log_prob");
    assert_eq!(lp.len(), k, "batch {}: one log-probability per frame", r.batch);
    let mut mine_lp = vec![0f32; k];
    match policy.recorded() {
        rollout::policy::Recorded::Categorical { n } => {
            let logits = f32s(r, "logits");
            let (mut mine, mut mine_z) = (vec![0i64; k], vec![0f32; k * n]);
            let record = rollout::policy::RecordMut {
                log_prob: &mut mine_lp,
                params: rollout::policy::ParamsMut::Logits(&mut mine_z),
            };
            policy
                .act_recording(obs, k, ActionsMut::Discrete(&mut mine), record)
                .expect("act");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&logits), bits(&mine_z), "batch {}: the logits", r.batch);
            for i in 0..k {
                let z = &logits[i * n..(i + 1) * n];
                let total: f64 = z.iter().map(|&v| f64::from(v).exp()).sum();
                let by_hand = (f64::from(z[mine[i] as usize]).exp() / total).ln();
                assert!((f64::from(lp[i]) - by_hand).abs() < 1e-5, "batch {} frame {i}", r.batch);
            }
        }
        rollout::policy::Recorded::Normal { d } => {
            let (loc, scale) = (f32s(r, "loc"), f32s(r, "scale"));
            let action = f32s(r, "action");
            let (mut mine, mut mine_loc, mut mine_scale) = (vec![0f32; k * d], vec![0f32; k * d], vec![0f32; k * d]);
            let record = rollout::policy::RecordMut {
                log_prob: &mut mine_lp,
                params: rollout::policy::ParamsMut::Normal {
                    loc: &mut mine_loc,
                    scale: &mut mine_scale,
                },
            };
            policy
                .act_recording(obs, k, ActionsMut::Continuous(&mut mine), record)
                .expect("act");
            assert_eq!(
                (&loc, &scale),
                (&mine_loc, &mine_scale),
                "batch {}: loc and scale",
                r.batch
            );
            for (i, &lp_i) in lp.iter().enumerate() {
                let mut by_hand = 0.0f64;
                for j in i * d..(i + 1) * d {
                    let (x, m, s) = (f64::from(action[j]), f64::from(loc[j]), f64::from(scale[j]));
                    by_hand += -((x - m) / s).powi(2) / 2.0 - s.ln() - (2.0 * std::f64::consts::PI).sqrt().ln();
                }
                assert!((f64::from(lp_i) - by_hand).abs() < 1e-5, "batch {} frame {i}", r.batch);
            }
        }
        other => panic!("a linear policy records {other:?}"),
    }
    for (i, (a, b)) in lp.iter().zip(&mine_lp).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5,
            "batch {} frame {i}: recorded {a}, the Rust policy's {b}",
            r.batch
        );
    }
}

/// Async: a mixed run (whichever nodes delivered), then one run of each kind alone, so
/// both implementations' actions are checked whatever the timing.
#[test]
fn deterministic_async_cartpole_actions_agree_both_ways() {
    deterministic_run("CartPole-v1", false, &NODES);
    deterministic_run("CartPole-v1", false, &[Node::Python]);
    deterministic_run("CartPole-v1", false, &[Node::Rust]);
}

/// Sync: every batch stacks a share of every node, so the mixed run checks both kinds.
#[test]
fn deterministic_sync_pendulum_actions_agree_both_ways() {
    deterministic_run("Pendulum-v1", true, &NODES);
}

/// A run of Python nodes that is checkpointed, stopped and resumed writes the very bytes of
/// the same run left alone: the Python node's snapshot (classic-control env state, numpy
/// generators, episodes, ids) goes through the Rust trainer's checkpoint file and back.
/// A deterministic run of the recurrent LSTM actor (tests/fixtures/onnx/cartpole_lstm.onnx)
/// on a Python and a Rust node, sync, episodes cut inside batches: every frame of either
/// node is the single-env replay's (`assert_recurrent_replay`): the same `is_init`, states,
/// logits and actions on onnxruntime and on tract.
#[test]
fn a_recurrent_actor_collects_the_same_on_python_and_rust_nodes() {
    let Some(py) = venv_python() else { return };
    let dir = temp_dir("pynode-recurrent");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/onnx/cartpole_lstm.onnx");
    let flags = [
        "--policy",
        "onnx",
        "--policy-file",
        model.to_str().expect("utf-8 path"),
        "--onnx-head",
        "categorical",
        "--exploration-type",
        "deterministic",
        // The tests check what the policy records: recorded on request.
        "--record",
        "true",
        "--max-frames-per-traj",
        "9",
        "--frames-per-batch",
        "24",
        "--total-frames",
        "312",
    ];
    let out = mixed_run(&py, &dir, "CartPole-v1", true, &flags, &[Node::Python, Node::Rust]);
    let inside = assert_recurrent_replay(&read_output(&out), &model);
    assert!(inside > 0, "episodes of 9 frames start inside batches of 6 steps");
}

#[test]
fn a_resumed_run_of_python_nodes_is_the_uninterrupted_run_byte_for_byte() {
    let Some(py) = venv_python() else { return };
    let run = |name: &str, total: &str, resume: bool| -> Vec<u8> {
        let dir = temp_dir(&format!("pynode-resume-{name}"));
        let ck = dir.path().join("ck");
        let common = |total: &str| {
            vec![
                "--policy".to_string(),
                "linear".into(),
                "--exploration-type".into(),
                "random".into(),
                "--frames-per-batch".into(),
                "40".into(),
                "--total-frames".into(),
                total.into(),
                "--checkpoint".into(),
                ck.display().to_string(),
                "--checkpoint-every".into(),
                "3".into(),
            ]
        };
        let first = if resume { "400" } else { total };
        let flags = common(first);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let out = mixed_run(&py, &dir, "CartPole-v1", false, &flags, &[Node::Python]);
        if resume {
            let mut flags = common(total);
            flags.extend(["--resume".to_string(), ck.display().to_string()]);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let again = mixed_run(&py, &dir, "CartPole-v1", false, &flags, &[Node::Python]);
            assert_eq!(again, out, "the resumed run appends to the same output file");
        }
        std::fs::read(&out).expect("read the output")
    };
    let whole = run("whole", "800", false);
    let resumed = run("resumed", "800", true);
    assert!(!whole.is_empty());
    assert!(
        whole == resumed,
        "the resumed run's output differs from the uninterrupted run's"
    );
}

/// An elastic run (`min_nodes` 1, `max_nodes` 2) of a Python node and a Rust node that
/// joins it: SIGTERM to the Python node makes it leave (`leave`, exit 0), counted as a leave,
/// not a loss, and the run goes on with the Rust node to exactly `total_frames`.
#[test]
fn a_python_node_leaves_an_elastic_run_on_sigterm_and_the_run_goes_on_exactly() {
    use rollout_actors::{DistributedCollector, Launcher};
    use rollout_tests::wait_with_deadline;
    use std::process::Stdio;
    use std::time::Instant;

    let Some(py) = venv_python() else { return };
    const TOKEN: &str = "python-node-elastic-token";
    const FPB: usize = 40;
    // Thousands of the Python node's batches: seconds of work for it alone.
    const TOTAL: usize = 4000 * FPB;
    let builder = DistributedCollector::builder()
        .env("CartPole-v1")
        .policy(PolicyConfig::Linear)
        .min_nodes(1)
        .max_nodes(2)
        .frames_per_batch(FPB)
        .total_frames(TOTAL as i64)
        .seed(5)
        .launcher(Launcher::External)
        .token(TOKEN.as_bytes())
        .heartbeat(Duration::from_millis(100), Duration::from_secs(5))
        .join_timeout(Duration::from_secs(60))
        .batch_timeout(Duration::from_secs(60));
    let (trainer, addr) = listening_on_a_thread(builder, |b| b.build().expect("collector"));
    let node = |mut c: Command, index: usize| {
        c.args(["--join", &addr.to_string(), "--index", &index.to_string()])
            .env("ROLLOUT_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        c.spawn().expect("spawn a node")
    };
    // The Python node starts the run alone (`build` returns once it joined), so the
    // run cannot end before it is in; the Rust node joins while it runs.
    let mut python = node(
        {
            let mut c = Command::new(&py);
            c.args(["-m", "rollout_node"]);
            c
        },
        1,
    );
    let mut c = trainer.join().expect("the trainer's thread");
    let mut frames = 0usize;
    let b = c.next_batch().expect("batch").expect("the run is not over");
    assert_eq!(b.node, Some(1), "the Python node alone delivers first");
    frames += b.data.numel();
    let mut rust = node(
        {
            let mut c = Command::new(rollout_bin());
            c.arg("node");
            c
        },
        0,
    );
    let end = Instant::now() + DEADLINE;
    loop {
        assert!(Instant::now() < end, "no batch of the Rust node");
        let b = c.next_batch().expect("batch").expect("the run is not over");
        frames += b.data.numel();
        if b.node == Some(0) {
            break;
        }
    }
    signal(python.id(), "TERM");
    let exit = wait_with_deadline(&mut python, DEADLINE);
    let mut err = String::new();
    std::io::Read::read_to_string(python.stderr.as_mut().expect("stderr"), &mut err).expect("read stderr");
    assert!(
        exit.is_some_and(|s| s.success()),
        "SIGTERM: the Python node leaves and exits 0: {exit:?}\n{err}"
    );
    assert!(err.contains("leaving the run (SIGTERM)"), "{err}");
    let mut after = 0;
    while let Some(b) = c.next_batch().expect("batch") {
        frames += b.data.numel();
        after += 1;
        assert!(after < 10_000, "runaway collection");
    }
    assert_eq!(frames, TOTAL, "total_frames exact");
    assert!(after > 0, "the run went on after the leave");
    let stats = c.stats().expect("stats");
    assert_eq!((stats.joined, stats.left), (2, 1), "a leave, not a loss: {stats:?}");
    c.shutdown().expect("shutdown");
    let exit = wait_with_deadline(&mut rust, DEADLINE);
    assert!(
        exit.is_some_and(|s| s.success()),
        "the Rust node exits 0 after Shutdown: {exit:?}"
    );
}

/// A PettingZoo env (issue 40) on two Python nodes, sync or async: the trainer takes the
/// nodes' multi-agent specs (protocol 10), checks every batch against the per-group layout
/// they give, and every frame of the `--output` file replays through PettingZoo by seed.
fn pettingzoo_run(sync: bool) {
    let Some(py) = venv_python() else { return };
    let env = "pettingzoo:mpe2.simple_spread_v3";
    let dir = temp_dir(&format!("pynode-pettingzoo-{sync}"));
    let flags = [
        "--policy",
        "random",
        "--frames-per-batch",
        "80",
        "--total-frames",
        "640",
    ];
    let out = mixed_run(&py, &dir, env, sync, &flags, &[Node::Python, Node::Python]);
    let records = read_output(&out);
    let frames: usize = records.iter().map(|r| r.data["collector.traj_ids"].len()).sum();
    assert_eq!(frames, 640);
    let lead: &[usize] = if sync { &[2, 2] } else { &[2] };
    for r in &records {
        let obs = r.data["agent.observation"].shape();
        assert_eq!(&obs[..lead.len()], lead, "batch {}: rows", r.batch);
        assert_eq!(&obs[lead.len() + 1..], &[3, 18], "batch {}: [agents, 18]", r.batch);
        assert!(!r.data.contains_key("observation") && !r.data.contains_key("next.reward"));
        assert!(r.data.contains_key("agent.action_log_prob") && r.data.contains_key("next.agent.mask"));
    }
    if !sync {
        assert_records_name_nodes_of_the_run(&records, 2);
    }
    let mut cmd = Command::new(&py);
    cmd.args(["-m", "rollout_node.replay"])
        .arg(&out)
        .args(["--env", env, "--seed", "11"]);
    run_bounded(&mut cmd, DEADLINE)
        .expect("start the replay checker")
        .assert_success("the PettingZoo replay by seed");
}

#[test]
fn a_sync_pettingzoo_run_of_python_nodes_replays_through_pettingzoo() {
    pettingzoo_run(true);
}

#[test]
fn an_async_pettingzoo_run_of_python_nodes_replays_through_pettingzoo() {
    pettingzoo_run(false);
}

/// `rollout collect --done-on-any` (protocol 12) on knights-archers-zombies, whose agents die
/// one by one, with two Python nodes: each episode ends at the first agent done (the env's
/// `next.done` is any agent's), and the `--output` file replays through PettingZoo by seed
/// under that rule (`--done-on-any`), not under the other.
#[test]
fn a_done_on_any_pettingzoo_run_ends_episodes_at_the_first_agent_and_replays_under_its_rule() {
    let Some(py) = venv_python() else { return };
    let env = "pettingzoo:pettingzoo.butterfly.knights_archers_zombies_v11";
    let config = r#"{"spawn_delay": 2, "max_zombies": 30, "max_cycles": 300}"#;
    let dir = temp_dir("pynode-pettingzoo-done-on-any");
    let flags = [
        "--policy",
        "random",
        "--env-config",
        config,
        "--done-on-any",
        "--frames-per-batch",
        "400",
        "--total-frames",
        "1600",
    ];
    let out = mixed_run(&py, &dir, env, false, &flags, &[Node::Python, Node::Python]);
    let records = read_output(&out);
    let (mut ends, mut early) = (0, 0);
    for r in &records {
        let done = r.data["next.done"].as_bool().expect("next.done is bool");
        let archers = r.data["next.archer.done"].as_bool().expect("bool");
        let knights = r.data["next.knight.done"].as_bool().expect("bool");
        // [E, T, 1] against [E, T, n, 1]: the env's flag is any agent's.
        for (i, d) in done.iter().enumerate() {
            let any = archers
                .iter()
                .skip(2 * i)
                .take(2)
                .chain(knights.iter().skip(2 * i).take(2))
                .any(|x| *x);
            let all = archers
                .iter()
                .skip(2 * i)
                .take(2)
                .chain(knights.iter().skip(2 * i).take(2))
                .all(|x| *x);
            assert_eq!(*d, any, "batch {} frame {i}", r.batch);
            ends += usize::from(*d);
            early += usize::from(any && !all);
        }
    }
    assert!(early > 0, "an agent ended before the others ({ends} ends)");
    let replay = |rule: &[&str]| {
        let mut cmd = Command::new(&py);
        cmd.args(["-m", "rollout_node.replay"])
            .arg(&out)
            .args(["--env", env, "--seed", "11", "--env-config", config])
            .args(rule);
        run_bounded(&mut cmd, DEADLINE).expect("start the replay checker")
    };
    replay(&["--done-on-any"]).assert_success("the PettingZoo replay by seed, episodes ending at any agent");
    let other = replay(&[]);
    assert_eq!(other.code(), Some(1), "the frames replay under the other rule too");
    assert!(other.stderr_text().contains("next.done"), "{}", other.stderr_text());
}
