//! Heterogeneous nodes (torchrl's per-node `collector_kwargs`): per-node envs, env
//! counts and exploration; each node's batches checked against its own layout.

use std::collections::HashMap;

use rollout::machine::{TrainerConfig, TrainerError, TrainerMachine};
use rollout::rollout::{batch_layout, keys};
use rollout::shares::Shares;
use rollout::{DType, EnvSpec, ExplorationType, PolicyConfig, Registry};
use rollout_actors::{CollectError, Collected, CollectorBuilder, DistributedCollector, Launcher, NodeOverrides};
use rollout_tests::{drain, listening_on_a_thread};

fn env_override(name: &str) -> NodeOverrides {
    NodeOverrides {
        env: Some(EnvSpec::from(name)),
        ..NodeOverrides::default()
    }
}

#[test]
fn async_nodes_with_different_envs_yield_their_own_layouts() {
    let mut c = DistributedCollector::builder()
        .env("CartPole-v1")
        .node_config(1, env_override("Counting"))
        .policy(PolicyConfig::Random)
        .nodes(2)
        .frames_per_batch(40)
        .total_frames(-1)
        .seed(3)
        .launcher(Launcher::Local)
        .build()
        .expect("async accepts nodes of different layouts");
    // Endless, until both nodes delivered: which node answers first is timing (on a
    // loaded machine one node can take many batches before the other starts).
    let mut batches = Vec::new();
    while batches.len() < 10
        || !(batches.iter().any(|b: &Collected| b.node == Some(0)) && batches.iter().any(|b| b.node == Some(1)))
    {
        batches.push(c.next_batch().expect("batch").expect("endless"));
        assert!(batches.len() < 10_000, "one node never delivered");
    }
    c.shutdown().expect("shutdown");
    let mut per_node = [0usize; 2];
    for b in &batches {
        assert_eq!(b.data.numel(), 40, "every batch is frames_per_batch");
        let node = b.node.expect("async batches name their node");
        per_node[node] += 1;
        let obs = b.data.get(keys::OBSERVATION).expect("observation");
        let act = b.data.get(keys::ACTION).expect("action");
        assert_eq!(obs.dtype(), DType::F32);
        if node == 0 {
            assert_eq!(obs.shape(), &[1, 40, 4], "CartPole observation");
            assert_eq!(act.dtype(), DType::I64, "CartPole's discrete action");
            assert_eq!(act.shape(), &[1, 40]);
        } else {
            assert_eq!(obs.shape(), &[1, 40, 1], "Counting observation");
            assert_eq!(act.dtype(), DType::F32, "Counting's box action");
            assert_eq!(act.shape(), &[1, 40, 1]);
        }
    }
    assert!(per_node.iter().all(|&n| n > 0), "both nodes delivered: {per_node:?}");
}

#[test]
fn sync_with_different_layouts_fails_at_build_naming_node_config() {
    let err = DistributedCollector::builder()
        .env("CartPole-v1")
        .node_config(1, env_override("Counting"))
        .nodes(2)
        .frames_per_batch(40)
        .total_frames(400)
        .sync(true)
        .launcher(Launcher::Local)
        .build()
        .expect_err("sync cannot stack different layouts");
    match err {
        CollectError::Config(e) => {
            assert_eq!(e.field, "node_config");
            assert!(
                e.reason
                    .contains("node 1's observation is f32 [1], node 0's is f32 [4]"),
                "{}",
                e.reason
            );
        }
        other => panic!("expected a config error, got {other}"),
    }
}

#[test]
fn sync_with_different_env_counts_fails_naming_node_config() {
    let err = DistributedCollector::builder()
        .env("Counting")
        .node_config(
            1,
            NodeOverrides {
                envs_per_node: Some(2),
                ..NodeOverrides::default()
            },
        )
        .nodes(2)
        .frames_per_batch(40)
        .sync(true)
        .plan_specs()
        .expect_err("sync stacks shares of equal shape");
    match err {
        CollectError::Config(e) => {
            assert_eq!(e.field, "node_config");
            assert!(e.reason.contains("node 1 has 2 envs and node 0 has 1"), "{}", e.reason);
        }
        other => panic!("expected a config error, got {other}"),
    }
}

#[test]
fn node_config_of_a_missing_node_is_refused() {
    let err = DistributedCollector::builder()
        .env("Counting")
        .node_config(2, env_override("Counting"))
        .nodes(2)
        .frames_per_batch(40)
        .plan_specs()
        .expect_err("there is no node 2");
    assert!(
        matches!(err, CollectError::Config(ref e) if e.field == "node_config"),
        "{err}"
    );
}

#[test]
fn sync_accepts_overrides_that_keep_the_layout() {
    let mut c = DistributedCollector::builder()
        .env("Counting")
        .node_configs(vec![
            NodeOverrides::default(),
            NodeOverrides {
                env: Some(EnvSpec {
                    name: "Counting".into(),
                    config: serde_json::json!({ "max_steps": 3 }),
                    done_on_any: false,
                }),
                exploration_type: Some(ExplorationType::Deterministic),
                ..NodeOverrides::default()
            },
        ])
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(20)
        .total_frames(100)
        .sync(true)
        .seed(0)
        .build()
        .expect("same layout on every node");
    let batches = drain(&mut c);
    c.shutdown().expect("shutdown");
    assert_eq!(batches.len(), 5);
    assert!(batches.iter().all(|b| b.data.batch_size() == [2, 1, 10]));
}

#[test]
fn plan_specs_gives_cumulative_lanes_and_seeds() {
    let (cfg, specs, seed) = DistributedCollector::builder()
        .env("Counting")
        .envs_per_node(2)
        .node_config(
            1,
            NodeOverrides {
                envs_per_node: Some(3),
                ..NodeOverrides::default()
            },
        )
        .nodes(3)
        .frames_per_batch(6)
        .seed(100)
        .plan_specs()
        .expect("valid");
    assert_eq!(seed, 100);
    assert_eq!(cfg.shares.envs_per_node(), [2, 3, 2]);
    let lanes: Vec<(u64, usize, u64, u64, usize)> = specs
        .iter()
        .map(|s| {
            (
                s.first_lane,
                s.envs_per_node,
                s.lanes,
                s.rollout.seed,
                s.rollout.frames_per_batch,
            )
        })
        .collect();
    assert_eq!(lanes, vec![(0, 2, 7, 100, 3), (2, 3, 7, 102, 2), (5, 2, 7, 105, 3)]);
}

#[test]
fn async_different_env_counts_keep_traj_ids_unique() {
    let mut c = DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .node_config(
            1,
            NodeOverrides {
                envs_per_node: Some(3),
                ..NodeOverrides::default()
            },
        )
        .nodes(2)
        .frames_per_batch(30)
        .total_frames(300)
        .seed(1)
        .build()
        .expect("valid");
    let batches = drain(&mut c);
    c.shutdown().expect("shutdown");
    let frames: usize = batches.iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames, 300);
    // lanes: node 0 has lane 0, node 1 lanes 1..4; 4 lanes in all.
    let mut seen: HashMap<i64, (usize, usize, i64)> = HashMap::new();
    for b in &batches {
        let node = b.node.expect("async");
        let want = if node == 0 { [1, 30] } else { [3, 10] };
        assert_eq!(b.data.batch_size(), &want);
        let ids = b.data.i64(keys::TRAJ_IDS).expect("ids");
        let steps = b.data.i64(keys::STEP_COUNT).expect("steps");
        let t = want[1];
        let ids = ids.as_slice().expect("contiguous");
        let steps = steps.as_slice().expect("contiguous");
        for r in 0..want[0] {
            let lane = if node == 0 { 0 } else { 1 + r as i64 };
            for i in 0..t {
                let (id, sc) = (ids[r * t + i], steps[r * t + i]);
                assert_eq!(id % 4, lane, "traj id {id} is in lane {lane}");
                match seen.get_mut(&id) {
                    None => {
                        seen.insert(id, (node, r, sc));
                    }
                    Some((n, row, last)) => {
                        assert_eq!((*n, *row), (node, r), "traj id {id} in two lanes");
                        assert_eq!(sc, *last + 1, "traj id {id} frames are consecutive");
                        *last = sc;
                    }
                }
            }
        }
    }
    assert!(seen.len() > 10);
}

fn two_node_cfg(sync: bool) -> TrainerConfig {
    TrainerConfig::new(Shares::new(10, vec![1, 1], 1, sync, None).expect("valid shares"))
}

#[test]
fn machine_layouts_are_per_node_and_sync_refuses_a_differing_one() {
    let reg = Registry::with_builtins();
    let layout = |name: &str| {
        let e = reg.make(&EnvSpec::from(name)).expect("builtin");
        batch_layout(e.observation_spec(), e.action_spec())
    };
    let (cart, count) = (layout("CartPole-v1"), layout("Counting"));
    let m = TrainerMachine::new(two_node_cfg(false))
        .expect("valid")
        .with_layouts(vec![Some(cart.clone()), Some(count.clone())]);
    assert_eq!(m.layout(0), Some(&cart));
    assert_eq!(m.layout(1), Some(&count));

    let mut m = TrainerMachine::new(two_node_cfg(true)).expect("valid");
    m.set_layout(0, cart.clone()).expect("the first layout is free");
    let err = m.set_layout(1, count).expect_err("sync stacks shares");
    match err {
        TrainerError::BadLayout { node: 1, reason } => {
            assert!(
                reason.contains("node 1's observation is f32 [1], node 0's is f32 [4]"),
                "{reason}"
            )
        }
        other => panic!("expected BadLayout, got {other}"),
    }
    assert_eq!(m.layout(1), None, "a refused layout is not recorded");
    m.set_layout(1, cart).expect("an equal layout");
    assert_eq!(m.set_layout(2, layout("Counting")), Err(TrainerError::UnknownNode(2)));
}

/// A remote node (the library's `run_node` on a thread, `Launcher::External`) whose
/// env differs from node 0's: it advertises its layout in `Ready` and the trainer
/// checks its batches against that one.
#[test]
fn remote_node_with_another_env_in_async() {
    use rollout_actors::remote::{run_node, NodeOptions};
    let token = b"hetero-token-for-tests".to_vec();
    let (trainer, addr) = listening_on_a_thread(
        DistributedCollector::builder()
            .env("CartPole-v1")
            .node_config(1, env_override("Counting"))
            .policy(PolicyConfig::Random)
            .nodes(2)
            .frames_per_batch(50)
            .total_frames(500)
            .seed(2)
            .launcher(Launcher::External)
            .token(token.clone())
            .join_timeout(std::time::Duration::from_secs(20))
            .batch_timeout(std::time::Duration::from_secs(20)),
        CollectorBuilder::build,
    );
    let nodes: Vec<_> = (0..2)
        .map(|i| {
            let token = token.clone();
            std::thread::spawn(move || {
                let opts = NodeOptions {
                    name: format!("hetero-{i}"),
                    index: Some(i),
                    connect_timeout: std::time::Duration::from_secs(20),
                    ..NodeOptions::default()
                };
                run_node(&addr.to_string(), &token, opts).map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut c = trainer.join().expect("trainer thread").expect("collector");
    let batches = drain(&mut c);
    c.shutdown().expect("shutdown");
    for n in nodes {
        assert_eq!(n.join().expect("node thread"), Ok(()));
    }
    let frames: usize = batches.iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames, 500, "frames exact");
    let mut per_node = [0usize; 2];
    for b in &batches {
        let node = b.node.expect("async");
        per_node[node] += 1;
        let obs = b.data.get(keys::OBSERVATION).expect("obs").shape().to_vec();
        let act = b.data.get(keys::ACTION).expect("action").dtype();
        if node == 0 {
            assert_eq!((obs, act), (vec![1, 50, 4], DType::I64));
        } else {
            assert_eq!((obs, act), (vec![1, 50, 1], DType::F32));
        }
    }
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");
}

/// In sync mode a remote node whose `Ready` advertises another layout than the one
/// the trainer builds from the env's specs (its registry builds another env under the
/// same name) is disconnected with the difference as the reason, and the run fails
/// clearly instead of stacking.
#[test]
fn sync_remote_ready_with_another_layout_is_refused() {
    use rollout_actors::remote::{run_node, NodeOptions};
    let token = b"hetero-token-for-tests".to_vec();
    let (trainer, addr) = listening_on_a_thread(
        DistributedCollector::builder()
            .env("Counting")
            .policy(PolicyConfig::Random)
            .nodes(2)
            .frames_per_batch(20)
            .total_frames(200)
            .sync(true)
            .seed(2)
            .launcher(Launcher::External)
            .token(token.clone())
            .join_timeout(std::time::Duration::from_secs(20))
            .batch_timeout(std::time::Duration::from_secs(20)),
        CollectorBuilder::build,
    );
    let nodes: Vec<_> = (0..2)
        .map(|i| {
            let token = token.clone();
            std::thread::spawn(move || {
                let mut registry = Registry::with_builtins();
                if i == 1 {
                    // Same name, another env: CartPole's observation is f32 [4].
                    let builtins = Registry::with_builtins();
                    registry.register("Counting", move |_c| builtins.make(&EnvSpec::from("CartPole-v1")));
                }
                let opts = NodeOptions {
                    name: format!("sync-{i}"),
                    index: Some(i),
                    connect_timeout: std::time::Duration::from_secs(20),
                    registry,
                    ..NodeOptions::default()
                };
                run_node(&addr.to_string(), &token, opts).map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut c = trainer.join().expect("trainer thread").expect("collector");
    let start = std::time::Instant::now();
    let err = match c.next_batch() {
        Err(e) => e.to_string(),
        Ok(Some(_)) => panic!("a sync batch stacked from nodes of different layouts"),
        Ok(None) => panic!("the run ended"),
    };
    assert!(
        err.contains("node 1's observation is f32 [4], env Counting's is f32 [1]"),
        "{err}"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(20));
    c.shutdown().ok();
    for n in nodes {
        let _ = n.join();
    }
}
