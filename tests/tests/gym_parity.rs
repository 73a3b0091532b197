//! Parity with gymnasium: replays transitions recorded by `scripts/gym_fixtures.py`
//! (fixtures in `tests/fixtures/gym/`) through the Rust envs and checks observations
//! (1e-5), rewards (bit-exact), terminated / truncated and the next internal state (exact).

use std::path::PathBuf;

use rollout::{Action, EnvSpec, Registry};
use serde::Deserialize;

/// One recorded transition; floats are strings holding Python's exact `repr`.
#[derive(Deserialize)]
struct Recorded {
    state: Vec<String>,
    elapsed: u64,
    action: serde_json::Value,
    obs: Vec<String>,
    next_state: Vec<String>,
    reward: String,
    terminated: bool,
    truncated: bool,
}

#[derive(Deserialize)]
struct Fixture {
    env: String,
    max_episode_steps: u64,
    transitions: Vec<Recorded>,
}

fn num(s: &str) -> f64 {
    s.parse().unwrap_or_else(|e| panic!("bad float `{s}` in fixture: {e}"))
}

fn nums(v: &[String]) -> Vec<f64> {
    v.iter().map(|s| num(s)).collect()
}

fn load(env_id: &str) -> Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/gym")
        .join(format!("{env_id}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let fixture: Fixture = serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    assert_eq!(fixture.env, env_id);
    fixture
}

fn replay(env_id: &str) {
    let fixture = load(env_id);
    assert!(fixture.transitions.len() >= 100, "{env_id}: too few transitions");
    let mut env = Registry::with_builtins().make(&EnvSpec::new(env_id)).unwrap();
    assert_eq!(env.name(), env_id);
    let dim = env.observation_spec().dim();
    let mut obs = vec![0.0f32; dim];
    env.reset(Some(0), &mut obs).unwrap();

    let (mut terminated, mut truncated) = (0, 0);
    for (i, t) in fixture.transitions.iter().enumerate() {
        let state = nums(&t.state);
        env.set_state(&state)
            .unwrap_or_else(|e| panic!("{env_id} #{i}: set_state({state:?}): {e}"));
        assert_eq!(env.state(), state, "{env_id} #{i}: state() after set_state");
        env.set_elapsed_steps(t.elapsed);
        assert_eq!(env.elapsed_steps(), t.elapsed);

        let continuous: Vec<f32>;
        let action = match &t.action {
            serde_json::Value::Number(n) => Action::Discrete(n.as_i64().unwrap()),
            serde_json::Value::Array(a) => {
                continuous = a
                    .iter()
                    .map(|s| {
                        let v = num(s.as_str().unwrap());
                        let f = v as f32;
                        assert_eq!(f64::from(f), v, "{env_id} #{i}: action {v} is not an f32");
                        f
                    })
                    .collect();
                Action::Continuous(&continuous)
            }
            other => panic!("{env_id} #{i}: bad action {other}"),
        };
        let step = env
            .step(action, &mut obs)
            .unwrap_or_else(|e| panic!("{env_id} #{i}: step({action:?}) from {state:?} failed: {e}"));

        let want_obs = nums(&t.obs);
        assert_eq!(want_obs.len(), dim, "{env_id} #{i}: observation length");
        for (k, (&got, &want)) in obs.iter().zip(&want_obs).enumerate() {
            assert!(
                (f64::from(got) - want).abs() <= 1e-5,
                "{env_id} #{i}: obs[{k}] = {got:e}, gymnasium {want:e} (state {state:?}, action {action:?}, obs {obs:?} vs {want_obs:?})"
            );
        }
        let want_reward = num(&t.reward);
        assert!(
            step.reward == want_reward,
            "{env_id} #{i}: reward {:e} (bits {:#x}), gymnasium {:e} (bits {:#x}); state {state:?}, action {action:?}",
            step.reward,
            step.reward.to_bits(),
            want_reward,
            want_reward.to_bits()
        );
        assert_eq!(
            (step.terminated, step.truncated),
            (t.terminated, t.truncated),
            "{env_id} #{i}: (terminated, truncated); state {state:?}, elapsed {}, action {action:?}",
            t.elapsed
        );
        let want_next = nums(&t.next_state);
        let got_next = env.state();
        assert_eq!(
            got_next, want_next,
            "{env_id} #{i}: next state; state {state:?}, action {action:?}"
        );
        assert_eq!(env.elapsed_steps(), t.elapsed + 1, "{env_id} #{i}: elapsed steps");
        terminated += usize::from(t.terminated);
        truncated += usize::from(t.truncated);
    }
    // The fixtures must exercise the episode ends.
    assert!(truncated >= 1, "{env_id}: no truncated transition in fixture");
    if env_id != "Pendulum-v1" {
        assert!(terminated >= 1, "{env_id}: no terminated transition in fixture");
    }
}

#[test]
fn cartpole_matches_gymnasium() {
    replay("CartPole-v1");
}

#[test]
fn pendulum_matches_gymnasium() {
    replay("Pendulum-v1");
}

#[test]
fn mountain_car_continuous_matches_gymnasium() {
    replay("MountainCarContinuous-v0");
}

#[test]
fn time_limits_match_gymnasium() {
    let registry = Registry::with_builtins();
    for env_id in ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0"] {
        let fixture = load(env_id);
        let mut env = registry.make(&EnvSpec::new(env_id)).unwrap();
        let mut obs = vec![0.0f32; env.observation_spec().dim()];
        env.reset(Some(1), &mut obs).unwrap();
        // Stepping from `max_episode_steps - 1` must truncate (gymnasium's TimeLimit).
        env.set_elapsed_steps(fixture.max_episode_steps - 1);
        let action = if env.action_spec().is_discrete() {
            Action::Discrete(0)
        } else {
            Action::Continuous(&[0.0])
        };
        assert!(env.step(action, &mut obs).unwrap().truncated, "{env_id}");
    }
}
