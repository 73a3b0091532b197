//! Envs the trainer cannot build: their specs come from the nodes (the first to be
//! ready sets them, every other must report the same), version 0 of the policy's
//! weights is built from them, and bad specs are refused naming the node and the key.
//! Real sockets throughout; the first scenario runs the real `rollout` CLI trainer with
//! the nodes of a user's own binary (actors/examples/custom_node.rs).

use std::net::SocketAddr;
use std::process::Command;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rollout::env::{CartPole, CartPoleConfig, Counting, CountingConfig};
use rollout::message::{FromNode, ToNode};
use rollout::schema::BatchLayout;
use rollout::space::{Bounds, EnvSpecs, Space};
use rollout::tensor::DType;
use rollout::wire::{NodeFrame, TrainerFrame, Welcome};
use rollout::{Env, EnvError, PolicyConfig, Registry};
use rollout_actors::remote::{run_node, NodeOptions};
use rollout_actors::{CollectError, CollectorBuilder, DistributedCollector, Launcher};
use rollout_tests::{
    actors_example_bin, connect, listening_on_a_thread, logged_in, logs, read_output, recv, rollout_bin, run_bounded,
    send, temp_dir, unique_name, wait_for, OwnLog, Running,
};

const TOKEN: &[u8] = b"s3cret-token-for-any-env";
const DEADLINE: Duration = Duration::from_secs(60);

/// The specs of `ShortCount-v0`, the env of actors/examples/custom_node.rs (a Counting env).
fn counting_specs() -> EnvSpecs {
    let e = Counting::new(CountingConfig {
        max_steps: 3,
        ..CountingConfig::default()
    })
    .expect("counting");
    EnvSpecs::from_specs(e.observation_spec(), e.action_spec())
}

/// The per-frame layout of a batch: each key's dtype and shape past the batch dims.
fn layout_of(data: &std::collections::BTreeMap<String, rollout::Tensor>, batch_dims: usize) -> BatchLayout {
    data.iter()
        .map(|(k, t)| (k.clone(), (t.dtype(), t.shape()[batch_dims..].to_vec())))
        .collect()
}

#[test]
fn rollout_collect_learns_a_users_env_from_the_nodes_of_its_own_binary() {
    let dir = temp_dir("any-env-cli");
    let token = dir.path().join("token");
    std::fs::write(&token, "any-env-cli-test-token-0123\n").expect("token");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let out = dir.path().join("out.msgpack");
    let node_bin = actors_example_bin("custom_node");
    let mut collect = Command::new(rollout_bin());
    collect
        .args(["collect", "--launcher", "external", "--listen", "127.0.0.1:0"])
        .args(["--env", "ShortCount-v0", "--nodes", "2", "--envs-per-node", "2"])
        .args(["--frames-per-batch", "40", "--total-frames", "200"])
        .args([
            "--policy",
            "constant",
            "--value",
            "1",
            "--exploration-type",
            "deterministic",
        ])
        .args(["--seed", "3", "--quiet", "--join-timeout", "60"])
        .arg("--token-file")
        .arg(&token)
        .arg("--output")
        .arg(&out);
    let mut trainer = Running::spawn(&mut collect).expect("start rollout collect");
    let addr = trainer.listening_addr(DEADLINE).to_string();
    let nodes: Vec<_> = (0..2)
        .map(|i| {
            let mut cmd = Command::new(&node_bin);
            cmd.args(["--join", &addr, "--name", &format!("custom-{i}"), "--token-file"])
                .arg(&token);
            thread::spawn(move || run_bounded(&mut cmd, DEADLINE).expect("start a custom node"))
        })
        .collect();
    let t = trainer.finish(DEADLINE);
    assert_eq!(t.code(), Some(0), "rollout collect failed:\n{}", t.stderr_text());
    for n in nodes {
        let n = n.join().expect("node thread");
        assert_eq!(n.code(), Some(0), "a custom node failed:\n{}", n.stderr_text());
    }
    let records = read_output(&out);
    let want = counting_specs().batch_layout();
    let (mut frames, mut top) = (0, 0.0f32);
    for r in &records {
        assert_eq!(
            layout_of(&r.data, 2),
            want,
            "batch {}: the layout of the nodes' specs",
            r.batch
        );
        assert_eq!(r.weights_version, 0, "version 0, built by the trainer from the specs");
        frames += r.data["collector.traj_ids"].shape().iter().product::<usize>();
        // ShortCount-v0 counts past 3 (the built-in Counting past 5): with every action
        // 1, observations 0 to 3 and the last step's next observation 4.
        let obs = r.data["observation"].as_f32().expect("f32 observations");
        assert!(obs.iter().all(|&o| [0.0, 1.0, 2.0, 3.0].contains(&o)), "{obs:?}");
        let next = r.data["next.observation"].as_f32().expect("f32 observations");
        top = next.iter().copied().fold(top, f32::max);
    }
    assert_eq!(frames, 200, "every frame asked for, in {} batches", records.len());
    assert_eq!(top, 4.0, "episodes of the node's own env end past its count of 3");
}

#[test]
fn the_local_launcher_refuses_an_env_its_registry_cannot_build_naming_env() {
    let f = run_bounded(
        Command::new(rollout_bin()).args(["collect", "--env", "ShortCount-v0", "--total-frames", "10"]),
        DEADLINE,
    )
    .expect("run rollout collect");
    assert_eq!(f.code(), Some(2), "{}", f.stderr_text());
    let err = f.stderr_text();
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].starts_with("error: invalid `env`: unknown env `ShortCount-v0`"),
        "{err}"
    );
    assert!(lines[0].contains("Local launcher"), "{err}");
}

/// A registry where `Custom-v0` is `env`.
fn registry_with(env: fn() -> Result<Box<dyn Env>, EnvError>) -> Registry {
    let mut r = Registry::with_builtins();
    r.register("Custom-v0", move |_c| env());
    r
}

fn counting_env() -> Result<Box<dyn Env>, EnvError> {
    Ok(Box::new(Counting::new(CountingConfig {
        max_steps: 3,
        ..CountingConfig::default()
    })?))
}

fn cartpole_env() -> Result<Box<dyn Env>, EnvError> {
    Ok(Box::new(CartPole::new(CartPoleConfig::default())?))
}

/// A trainer of `nodes` external nodes of `Custom-v0`, which its registry cannot build,
/// and the address it listens on.
fn trainer(nodes: usize, policy: PolicyConfig) -> (JoinHandle<Result<DistributedCollector, CollectError>>, SocketAddr) {
    logs();
    listening_on_a_thread(
        DistributedCollector::builder()
            .env("Custom-v0")
            .policy(policy)
            .nodes(nodes)
            .frames_per_batch(20)
            .total_frames(100)
            .seed(0)
            .launcher(Launcher::External)
            .token(TOKEN)
            .heartbeat(Duration::from_millis(200), Duration::from_secs(10))
            .join_timeout(DEADLINE)
            .batch_timeout(DEADLINE),
        CollectorBuilder::build,
    )
}

/// A library node named `name` whose registry builds `Custom-v0` as `env`, on a thread.
fn node(addr: SocketAddr, name: String, env: fn() -> Result<Box<dyn Env>, EnvError>) -> JoinHandle<Result<(), String>> {
    thread::spawn(move || {
        let opts = NodeOptions {
            name,
            registry: registry_with(env),
            connect_timeout: DEADLINE,
            ..NodeOptions::default()
        };
        run_node(&addr.to_string(), TOKEN, opts).map_err(|e| e.to_string())
    })
}

#[test]
fn a_node_reporting_other_specs_than_the_first_is_refused_by_name_and_the_run_goes_on() {
    let (t, addr) = trainer(2, PolicyConfig::Linear);
    let (a, b) = (unique_name("counting"), unique_name("cartpole"));
    let (log_a, log_b) = (OwnLog::node(&a), OwnLog::node(&b));
    let nodes = [node(addr, a, counting_env), node(addr, b, cartpole_env)];
    let mut c = t.join().expect("trainer thread").expect("collector");
    let mut batches = Vec::new();
    while let Some(batch) = c.next_batch().expect("the run goes on with the first node") {
        batches.push(batch);
    }
    c.shutdown().expect("shutdown");
    let results: Vec<Result<(), String>> = nodes.into_iter().map(|n| n.join().expect("node thread")).collect();
    // Whichever was ready first set the env's specs; the other was refused.
    let (kept, specs, refused_log) = match (&results[0], &results[1]) {
        (Ok(()), Err(_)) => (0, counting_specs(), log_b),
        (Err(_), Ok(())) => {
            let e = cartpole_env().expect("cartpole");
            (1, EnvSpecs::from_specs(e.observation_spec(), e.action_spec()), log_a)
        }
        other => panic!("exactly one node refused, got {other:?}"),
    };
    let node_of_kept = batches[0].node.expect("async batches name their node");
    let frames: usize = batches.iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames, 100, "the run ends exact");
    for b in &batches {
        assert_eq!(
            b.node,
            Some(node_of_kept),
            "every batch from the node that was ready first"
        );
        let data: std::collections::BTreeMap<String, rollout::Tensor> =
            b.data.iter().map(|(k, t)| (k.to_string(), t.clone())).collect();
        let linear = specs.batch_layout_recording(specs.recorded(&PolicyConfig::Linear));
        assert_eq!(layout_of(&data, 2), linear, "node {kept}'s specs' layout");
    }
    let refused = refused_log.lines().join("\n");
    assert!(refused.contains("closing connection to node"), "{refused}");
    assert!(
        refused.contains("(the first of env Custom-v0 to be ready)") && refused.contains("'s observation is f32 ["),
        "the refusal names both nodes and the difference: {refused}"
    );
}

/// A scripted node that logged in as `name`, sent `ready` with `specs` (and their
/// layout, or an empty one when they have none), and reads until the trainer closes.
fn scripted_ready(addr: SocketAddr, name: &str, specs: EnvSpecs, layout: BatchLayout) -> JoinHandle<Welcome> {
    let name = name.to_string();
    thread::spawn(move || {
        let mut s = connect(addr, DEADLINE);
        let w = logged_in(&mut s, TOKEN, &name, None);
        send(
            &mut s,
            &NodeFrame::Message(FromNode::Ready {
                node: w.node_index,
                layout,
                specs: Some(Box::new(specs)),
            }),
        );
        // Answers the seeding chain; anything else is left unanswered until the close.
        while let Some(f) = recv(&mut s) {
            if let TrainerFrame::Message(ToNode::Seed(seed)) = f {
                let _ = rollout_tests::try_send(
                    &mut s,
                    &NodeFrame::Message(FromNode::Seeded {
                        node: w.node_index,
                        next_seed: seed.seed.wrapping_add(1),
                    }),
                );
            }
        }
        w
    })
}

/// Dicts nested `depth` deep around an f32 box.
fn nested(depth: usize) -> Space {
    (0..depth).fold(
        Space::Box {
            dtype: DType::F32,
            shape: vec![1],
            low: None,
            high: None,
        },
        |inner, _| Space::Dict {
            spaces: [("a".to_string(), inner)].into(),
        },
    )
}

#[test]
fn hostile_specs_are_refused_at_ready_before_anything_is_sized_by_them() {
    let (t, addr) = trainer(3, PolicyConfig::Linear);
    let (huge_name, deep_name, good_name) = (unique_name("huge"), unique_name("deep"), unique_name("good"));
    let (huge_log, deep_log) = (OwnLog::node(&huge_name), OwnLog::node(&deep_name));
    // 2^80 elements: sized by anything, it would not fit any memory.
    let huge = EnvSpecs {
        observation: Space::Box {
            dtype: DType::U8,
            shape: vec![1 << 40, 1 << 40],
            low: None,
            high: None,
        },
        action: Space::Discrete { n: 2, start: 0 },
        agents: None,
    };
    let huge_layout: BatchLayout = [("observation".to_string(), (DType::U8, vec![1 << 40, 1 << 40]))].into();
    let deep = EnvSpecs {
        observation: nested(40),
        action: Space::Discrete { n: 2, start: 0 },
        agents: None,
    };
    let hostile = [
        scripted_ready(addr, &huge_name, huge, huge_layout),
        scripted_ready(addr, &deep_name, deep, BatchLayout::new()),
    ];
    let good = node(addr, good_name, counting_env);
    let mut c = t.join().expect("trainer thread").expect("collector");
    let mut frames = 0;
    while let Some(b) = c.next_batch().expect("the run goes on with the good node") {
        frames += b.data.numel();
    }
    c.shutdown().expect("shutdown");
    assert_eq!(frames, 100);
    assert_eq!(good.join().expect("good node"), Ok(()));
    for h in hostile {
        h.join().expect("hostile thread");
    }
    let huge = huge_log.lines().join("\n");
    assert!(
        huge.contains("`specs`: observation: a box of shape [1099511627776, 1099511627776] has more than"),
        "{huge}"
    );
    let deep = deep_log.lines().join("\n");
    assert!(
        deep.contains("`specs`: observation.a.a.a.a: dicts nested deeper than 4"),
        "{deep}"
    );
}

#[test]
fn a_policy_that_cannot_take_the_nodes_specs_fails_the_run_naming_the_key() {
    let (t, addr) = trainer(1, PolicyConfig::Linear);
    let image = EnvSpecs {
        observation: Space::Box {
            dtype: DType::U8,
            shape: vec![8, 8, 3],
            low: Some(Bounds::Uniform(0.0)),
            high: Some(Bounds::Uniform(255.0)),
        },
        action: Space::Discrete { n: 6, start: 0 },
        agents: None,
    };
    let layout = image.batch_layout();
    let raw = scripted_ready(addr, &unique_name("atari"), image, layout);
    let mut c = t.join().expect("trainer thread").expect("collector");
    let e = c.next_batch().expect_err("the run fails");
    assert_eq!(
        e.to_string(),
        "env Custom-v0: policy linear cannot take observation: u8 box [8, 8, 3]: built-in policies take a 1-D f32 \
         or f64 box or a discrete space"
    );
    assert!(matches!(e, CollectError::Trainer(_)), "{e:?}");
    c.shutdown().ok();
    drop(c);
    raw.join().expect("raw node");
}

#[test]
fn a_node_whose_specs_make_the_mlp_too_big_for_a_frame_is_refused_by_name_and_an_honest_node_serves() {
    let mlp = PolicyConfig::Mlp { hidden: vec![64, 64] };
    let (t, addr) = trainer(2, mlp.clone());
    // The issue's case: the counting env's observation (one value), 2^21 discrete
    // actions: a 64-64 MLP of 136 M parameters (545 MB), over the default 256 MiB frame.
    let mut hostile = counting_specs();
    hostile.action = Space::Discrete { n: 1 << 21, start: 0 };
    let layout = hostile.batch_layout_recording(hostile.recorded(&mlp));
    let hostile_name = unique_name("wide");
    let hostile_log = OwnLog::node(&hostile_name);
    let raw = scripted_ready(addr, &hostile_name, hostile, layout);
    // Ready first: the honest node connects once the hostile one joined (its `ready`
    // follows its `welcome` at once; the honest node's comes after a login and the
    // building of its workers).
    wait_for(Instant::now() + DEADLINE, "the hostile node to join", || {
        hostile_log.lines().into_iter().find(|l| l.contains("node joined"))
    });
    let good = node(addr, unique_name("good"), counting_env);
    let mut c = t.join().expect("trainer thread").expect("collector");
    let mut frames = 0;
    while let Some(b) = c.next_batch().expect("the run goes on with the honest node") {
        assert_eq!(b.weights_version, 0);
        frames += b.data.numel();
    }
    c.shutdown().expect("shutdown");
    assert_eq!(
        frames, 100,
        "every frame, from the honest node, whose specs set the env's"
    );
    let refusal = hostile_log.lines().join("\n");
    let params = mlp.spec_params(1, 1 << 21).expect("counted");
    assert_eq!(params, 136_319_168, "64 + 64 + 64 * 64 + 64 + 64 * 2^21 + 2^21");
    assert!(
        refusal.contains(&format!(
            "node 0 advertised a layout the trainer cannot use: policy mlp would have {params} parameters for its \
             specs: a weight update over max_frame (268435456); nothing was built"
        )),
        "{refusal}"
    );
    assert_eq!(good.join().expect("good node"), Ok(()));
    raw.join().expect("hostile thread");
}

/// `rollout collect` with `args`, which must fail at once with exit code `code` and one
/// line on stderr: that line.
fn fails_with_one_line(args: &[&str], code: i32) -> String {
    let f = run_bounded(Command::new(rollout_bin()).arg("collect").args(args), DEADLINE).expect("run rollout collect");
    let err = f.stderr_text();
    assert_eq!(f.code(), Some(code), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    lines[0].to_string()
}

#[test]
fn a_bad_env_spec_is_a_usage_error_naming_env_spec_and_the_key() {
    let discrete = r#""action": {"kind": "discrete", "n": 2}"#;
    let line = fails_with_one_line(
        &[
            "--env",
            "Foo-v0",
            "--env-spec",
            &format!(r#"{{"observation": {{"kind": "tuple"}}, {discrete}}}"#),
        ],
        2,
    );
    assert!(
        line.starts_with("error: invalid `env_spec`: observation: unknown variant `tuple`"),
        "{line}"
    );
    let line = fails_with_one_line(
        &[
            "--env",
            "Foo-v0",
            "--env-spec",
            &format!(r#"{{"observation": {{"kind": "box", "dtype": "u8", "shape": [4, 0]}}, {discrete}}}"#),
        ],
        2,
    );
    assert_eq!(
        line,
        "error: invalid `env_spec`: observation: a box of shape [4, 0] has no element"
    );
    let dir = temp_dir("any-env-spec");
    let file = dir.path().join("spec.json");
    std::fs::write(
        &file,
        format!(
            r#"{{"observation": {{"kind": "dict", "spaces": {{"a.b": {{"kind": "discrete", "n": 2}}}}}}, {discrete}}}"#
        ),
    )
    .expect("spec file");
    let line = fails_with_one_line(&["--env", "Foo-v0", "--env-spec", &format!("@{}", file.display())], 2);
    assert!(
        line.starts_with("error: invalid `env_spec`: observation: entry name \"a.b\""),
        "{line}"
    );
    // Declared specs of an env the trainer builds must be its own.
    let counting = serde_json::to_string(&counting_specs().canonical()).expect("json");
    let line = fails_with_one_line(&["--env", "CartPole-v1", "--env-spec", &counting], 2);
    assert!(
        line.starts_with(
            "error: invalid `env_spec`: the declared specs's observation is f32 [1], env CartPole-v1's is f32 [4]"
        ),
        "{line}"
    );
}

#[test]
fn declared_specs_build_version_0_up_front_and_hold_the_nodes_to_them() {
    let dir = temp_dir("any-env-declared");
    let token = dir.path().join("token");
    std::fs::write(&token, "any-env-declared-token-0123\n").expect("token");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let out = dir.path().join("out.msgpack");
    let spec = dir.path().join("spec.json");
    // Canonical: JSON has no infinite bounds, which absent bounds stand for.
    std::fs::write(
        &spec,
        serde_json::to_string(&counting_specs().canonical()).expect("json"),
    )
    .expect("spec file");
    let node_bin = actors_example_bin("custom_node");
    let mut collect = Command::new(rollout_bin());
    collect
        .args(["collect", "--launcher", "external", "--listen", "127.0.0.1:0"])
        .args(["--env", "ShortCount-v0", "--nodes", "1", "--policy", "linear"])
        .args([
            "--frames-per-batch",
            "20",
            "--total-frames",
            "60",
            "--quiet",
            "--join-timeout",
            "60",
        ])
        .arg("--env-spec")
        .arg(format!("@{}", spec.display()))
        .arg("--token-file")
        .arg(&token)
        .arg("--output")
        .arg(&out);
    let mut trainer = Running::spawn(&mut collect).expect("start rollout collect");
    let addr = trainer.listening_addr(DEADLINE).to_string();
    let mut cmd = Command::new(&node_bin);
    cmd.args(["node", "--join", &addr, "--index", "0", "--token-file"])
        .arg(&token);
    let n = run_bounded(&mut cmd, DEADLINE).expect("start a custom node");
    let t = trainer.finish(DEADLINE);
    assert_eq!(t.code(), Some(0), "rollout collect failed:\n{}", t.stderr_text());
    assert_eq!(n.code(), Some(0), "the node failed:\n{}", n.stderr_text());
    let records = read_output(&out);
    assert_eq!(records.len(), 3);
    let specs = counting_specs();
    for r in &records {
        assert_eq!(
            layout_of(&r.data, 2),
            specs.batch_layout_recording(specs.recorded(&PolicyConfig::Linear))
        );
    }
}

#[test]
fn rollout_collect_fails_in_one_line_when_its_policy_cannot_take_the_nodes_specs() {
    let dir = temp_dir("any-env-policy");
    let token = dir.path().join("token");
    std::fs::write(&token, std::str::from_utf8(TOKEN).expect("utf-8")).expect("token");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let mut collect = Command::new(rollout_bin());
    collect
        .args(["collect", "--launcher", "external", "--listen", "127.0.0.1:0"])
        .args(["--env", "ALE/Pong-v5", "--nodes", "1", "--policy", "mlp", "--quiet"])
        .args(["--frames-per-batch", "20", "--total-frames", "60"])
        .arg("--token-file")
        .arg(&token);
    let mut trainer = Running::spawn(&mut collect).expect("start rollout collect");
    let addr = trainer.listening_addr(DEADLINE);
    let pong = EnvSpecs {
        observation: Space::Box {
            dtype: DType::U8,
            shape: vec![210, 160, 3],
            low: Some(Bounds::Uniform(0.0)),
            high: Some(Bounds::Uniform(255.0)),
        },
        action: Space::Discrete { n: 6, start: 0 },
        agents: None,
    };
    let layout = pong.batch_layout();
    let raw = scripted_ready(addr, "pong", pong, layout);
    let t = trainer.finish(DEADLINE);
    raw.join().expect("raw node");
    let err = t.stderr_text();
    assert_eq!(t.code(), Some(1), "exit 1, as any run that fails: {err}");
    // Log lines may come before it; the error is the last line, whole.
    assert_eq!(
        err.lines().rfind(|l| !l.trim().is_empty()),
        Some(
            "error: env ALE/Pong-v5: policy mlp cannot take observation: u8 box [210, 160, 3]: built-in policies take \
             a 1-D f32 or f64 box or a discrete space"
        ),
        "{err}"
    );
}
