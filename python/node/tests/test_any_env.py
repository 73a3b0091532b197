"""Real gymnasium envs of every space the node collects (Acrobot, MuJoCo, Atari through ale-py,
a dict env), in process: the node's ``specs`` and layout are what PROTOCOL.md §3 (Spaces)
gives, and every collected frame replays: a fresh env reset with the row's seed and stepped
with the recorded actions gives every observation, reward, termination and truncation."""

import math

import gymnasium as gym
import numpy as np
import pytest

import spaces_env  # noqa: F401  (registers DictSpaces-v0)
from conftest import node_spec
from rollout_node.collect import Workers, restart_seed
from rollout_node.spaces import SpaceError

SEED = 11
INF = math.inf
LINEAR = {"config": {"kind": "linear"}, "exploration": "random", "init_seed": 0}


def spec(env, envs, config=None, policy=None, **rollout):
    """A node acting with ``policy`` (default: random), seeded with ``SEED``."""
    policy = policy or {"config": {"kind": "random"}, "exploration": "random", "init_seed": 0}
    return node_spec(env, envs, config, policy, **{"seed": SEED, **rollout})


def f32s(*values):
    return [float(v) for v in np.array(values, np.float32)]


def collect(w, frames, batches):
    got = [w.collect(frames) for _ in range(batches)]
    return {k: np.concatenate([b[k] for b in got], axis=1) for k in got[0]}


def entries(layout, head):
    """``{suffix: key}`` of the observation entries under ``head`` in ``layout``."""
    return {k[len(head):]: k for k in layout if k == head or k.startswith(head + ".")}


def check_layout(batch, layout, E, T):
    assert set(batch) == set(layout)
    for key, (dtype, shape) in layout.items():
        want = {"f32": np.float32, "f64": np.float64, "u8": np.uint8, "i64": np.int64, "bool": np.bool_}[dtype]
        assert batch[key].dtype == want, f"`{key}` is {batch[key].dtype}, the layout says {dtype}"
        assert batch[key].shape == (E, T, *shape), f"`{key}` has shape {batch[key].shape}"


def leaf(obs, suffix):
    for name in suffix.split(".")[1:]:
        obs = obs[name]
    return np.asarray(obs)


def assert_obs(batch, head, k, t, obs, where):
    for suffix, key in entries(batch, head).items():
        got, want = batch[key][k, t], leaf(obs, suffix)
        if got.dtype == np.float32 and want.dtype == np.float64:  # --double-to-float: within 1e-6
            assert np.allclose(got, want, rtol=1e-6, atol=1e-6), f"{where}: `{key}` {got} != {want}"
        else:
            assert got.shape == want.shape and np.array_equal(got, want.astype(got.dtype)), f"{where}: `{key}` {got} != {want}"
            assert np.array_equal(got.astype(np.float64), want.astype(np.float64)), f"{where}: `{key}` narrowed"


def replay(batch, env, config, envs, rows=None, seeds=None, first_ids=None):
    """Every frame of every row (of ``rows``) against a fresh env reset with the row's seed
    (``SEED + k``, or ``seeds[k]``; then unseeded after each end, as the node's same-step
    autoreset does) and stepped with the recorded actions. Returns the episodes that ended
    (terminated, truncated)."""
    ended = [0, 0]
    T = batch["collector.traj_ids"].shape[1]
    for k in range(envs) if rows is None else rows:
        e = gym.make(env, **(config or {}))
        obs, _ = e.reset(seed=SEED + k if seeds is None else seeds[k])
        traj, sc = k if first_ids is None else first_ids[k], 0
        for t in range(T):
            where = f"row {k} frame {t}"
            assert_obs(batch, "observation", k, t, obs, where)
            assert batch["collector.traj_ids"][k, t] == traj and batch["step_count"][k, t, 0] == sc, where
            a = batch["action"][k, t]
            nxt, r, te, tr, _ = e.step(int(a) if a.ndim == 0 else a)
            assert_obs(batch, "next.observation", k, t, nxt, where)
            assert abs(float(batch["next.reward"][k, t, 0]) - r) <= 1e-6 * max(1.0, abs(r)), f"{where}: reward"
            assert bool(batch["next.terminated"][k, t, 0]) == te, f"{where}: terminated"
            assert bool(batch["next.truncated"][k, t, 0]) == tr, f"{where}: truncated"
            assert bool(batch["next.done"][k, t, 0]) == (te or tr), f"{where}: done"
            sc += 1
            obs = nxt
            if te or tr:
                ended[0 if te else 1] += 1
                obs, _ = e.reset()
                traj, sc = traj + envs, 0
        e.close()
    return ended


def set_weights(w, seed=3):
    rng = np.random.default_rng(seed)
    w.policy.set_weights(0, {k: rng.uniform(-0.5, 0.5, s).astype(np.float32) for k, s in w.policy.layout.items()})


ACROBOT_SPECS = {
    "observation": {"kind": "box", "dtype": "f32", "shape": [6],
                    "low": f32s(-1, -1, -1, -1, -4 * np.pi, -9 * np.pi), "high": f32s(1, 1, 1, 1, 4 * np.pi, 9 * np.pi)},
    "action": {"kind": "discrete", "n": 3},
}
CHEETAH_SPECS = {
    "observation": {"kind": "box", "dtype": "f64", "shape": [17], "low": -INF, "high": INF},
    "action": {"kind": "box", "dtype": "f32", "shape": [6], "low": -1.0, "high": 1.0},
}
PONG_SPECS = {
    "observation": {"kind": "box", "dtype": "u8", "shape": [210, 160, 3], "low": 0.0, "high": 255.0},
    "action": {"kind": "discrete", "n": 6},
}
COMMON = {"next.reward": ["f32", [1]], "next.done": ["bool", [1]], "next.terminated": ["bool", [1]],
          "next.truncated": ["bool", [1]], "collector.traj_ids": ["i64", []], "step_count": ["i64", [1]]}


#: What the random policy records beside its actions, for every action space kind.
LOG_PROB = {"action_log_prob": ["f32", []]}


def box_layout(dtype, shape, action, recorded=LOG_PROB):
    return {"observation": [dtype, shape], "next.observation": [dtype, shape], "action": action, **COMMON,
            **recorded}


@pytest.mark.parametrize("policy", ["random", "linear"])
def test_acrobot_frames_replay_exactly(policy):
    w = Workers(spec("Acrobot-v1", 2, {"max_episode_steps": 30}, LINEAR if policy == "linear" else None))
    if policy == "linear":
        set_weights(w)
    assert w.specs == ACROBOT_SPECS
    recorded = {**LOG_PROB, "logits": ["f32", [3]]} if policy == "linear" else LOG_PROB
    assert w.layout() == box_layout("f32", [6], ["i64", []], recorded)
    b = collect(w, 2 * 40, 2)
    check_layout(b, w.layout(), 2, 80)
    assert replay(b, "Acrobot-v1", {"max_episode_steps": 30}, 2)[1] >= 4
    w.close()


def test_halfcheetah_keeps_its_f64_observations_and_its_frames_replay_exactly():
    pytest.importorskip("mujoco")
    config = {"max_episode_steps": 25}
    w = Workers(spec("HalfCheetah-v5", 2, config, LINEAR))  # the network takes the f64 obs as f32
    set_weights(w)
    assert w.specs == CHEETAH_SPECS
    normal = {**LOG_PROB, "loc": ["f32", [6]], "scale": ["f32", [6]]}
    assert w.layout() == box_layout("f64", [17], ["f32", [6]], normal)
    b = collect(w, 2 * 30, 2)
    check_layout(b, w.layout(), 2, 60)
    assert b["observation"].dtype == np.float64
    assert replay(b, "HalfCheetah-v5", config, 2) == [0, 4]
    w.close()


def test_double_to_float_reports_and_collects_f64_boxes_as_f32():
    pytest.importorskip("mujoco")
    config = {"max_episode_steps": 25}
    w = Workers(spec("HalfCheetah-v5", 1, config), double_to_float=True)
    assert w.specs["observation"] == {"kind": "box", "dtype": "f32", "shape": [17], "low": -INF, "high": INF}
    assert w.layout() == box_layout("f32", [17], ["f32", [6]])
    b = collect(w, 30, 1)
    check_layout(b, w.layout(), 1, 30)
    replay(b, "HalfCheetah-v5", config, 1)
    w.close()


def test_hopper_episodes_that_terminate_replay_exactly():
    pytest.importorskip("mujoco")
    w = Workers(spec("Hopper-v5", 2))
    b = collect(w, 2 * 60, 1)
    check_layout(b, w.layout(), 2, 60)
    assert replay(b, "Hopper-v5", None, 2)[0] >= 1  # random actions topple it
    w.close()


def test_pong_keeps_its_uint8_frames_and_its_frames_replay_exactly():
    pytest.importorskip("ale_py")
    config = {"max_episode_steps": 40}
    w = Workers(spec("ALE/Pong-v5", 2, config))  # registered by the node: ALE ids are ale-py's
    assert w.specs == PONG_SPECS
    assert w.layout() == box_layout("u8", [210, 160, 3], ["i64", []])
    b = collect(w, 2 * 50, 2)
    check_layout(b, w.layout(), 2, 100)
    assert set(np.unique(b["action"])) <= set(range(6)) and len(np.unique(b["action"])) > 1
    assert replay(b, "ALE/Pong-v5", config, 2) == [0, 4]
    w.close()


def test_a_network_policy_cannot_take_an_image_and_says_which_key():
    pytest.importorskip("ale_py")
    with pytest.raises(SpaceError, match=r"policy linear cannot take observation: u8 box \[210, 160, 3\]") as e:
        Workers(spec("ALE/Pong-v5", 1, policy=LINEAR))
    assert e.value.key == "observation"


DICT_OBS = {"kind": "dict", "spaces": {
    "count": {"kind": "discrete", "n": 20, "start": -3},
    "flags": {"kind": "multi_binary", "n": 3},
    "inner": {"kind": "dict", "spaces": {
        "img": {"kind": "box", "dtype": "u8", "shape": [4, 4], "low": 0.0, "high": 255.0},
        "level": {"kind": "box", "dtype": "i64", "shape": [], "low": -5.0, "high": 5.0},
    }},
    "pos": {"kind": "box", "dtype": "f64", "shape": [2], "low": -1.0, "high": 1.0},
}}
DICT_ACTIONS = {
    "multi_discrete": ({"kind": "multi_discrete", "nvec": [3, 2]}, ["i64", [2]]),
    "multi_binary": ({"kind": "multi_binary", "n": 4}, ["u8", [4]]),
    "discrete": ({"kind": "discrete", "n": 3, "start": -1}, ["i64", []]),
}


@pytest.mark.parametrize("action", sorted(DICT_ACTIONS))
def test_dict_observations_are_one_key_per_leaf_and_their_frames_replay_exactly(action):
    config = {"action": action}
    w = Workers(spec("DictSpaces-v0", 3, config, max_frames_per_traj=None))
    act_space, act_entry = DICT_ACTIONS[action]
    assert w.specs == {"observation": DICT_OBS, "action": act_space}
    obs = {".count": ["i64", []], ".flags": ["u8", [3]], ".inner.img": ["u8", [4, 4]],
           ".inner.level": ["i64", []], ".pos": ["f64", [2]]}
    want = {head + s: e for s, e in obs.items() for head in ("observation", "next.observation")}
    assert w.layout() == {**want, "action": act_entry, **COMMON, **LOG_PROB}
    b = collect(w, 3 * 40, 2)
    check_layout(b, w.layout(), 3, 80)
    terminated, truncated = replay(b, "DictSpaces-v0", config, 3)
    assert terminated >= 3 and truncated >= 1
    a = b["action"].reshape(3 * 80, -1)
    if action == "multi_discrete":  # every element uniform in 0..nvec[i]
        assert set(a[:, 0]) == {0, 1, 2} and set(a[:, 1]) == {0, 1}
    elif action == "multi_binary":
        assert set(a.reshape(-1)) == {0, 1}
    else:  # start + a uniform index
        assert set(a.reshape(-1)) == {-1, 0, 1}
    w.close()


def test_a_space_the_node_cannot_collect_is_refused_naming_its_key():
    with pytest.raises(SpaceError, match=r"^observation\.foo: Tuple\(Discrete\(2\), Discrete\(3\)\) cannot be collected") as e:
        Workers(spec("TupleInDict-v0", 1))
    assert e.value.key == "observation.foo"


def test_a_dict_env_that_raises_mid_batch_has_its_row_collected_again_and_every_frame_replays():
    # Env 1 of 3 raises at its 17th step: rows 0 and 2 keep their frames, row 1 is the
    # rebuilt env's from its first frame (reset with the restart seed, ids past the old ones).
    spaces_env.COUNT[0] = -1
    config = {"action": "multi_discrete", "fail_at": 17}
    w = Workers(spec("FlakyDictSpaces-v0", 3, config))
    b = w.collect(3 * 30)
    assert w.restart_count == [0, 1, 0]
    check_layout(b, w.layout(), 3, 30)
    first = int(b["collector.traj_ids"][1, 0])
    assert first > 1 and first % 3 == 1
    replay(b, "DictSpaces-v0", {"action": "multi_discrete"}, 3, rows=[0, 2])
    replay(b, "DictSpaces-v0", {"action": "multi_discrete"}, 3, rows=[1],
           seeds={1: restart_seed(SEED + 1, 1)}, first_ids={1: first})
    w.close()


@pytest.mark.parametrize("env,config", [("DictSpaces-v0", {"action": "multi_binary"}), ("CartPole-v1", None)])
def test_batches_written_into_recycled_arrays_are_the_batches_of_new_ones(env, config):
    fresh, reused = Workers(spec(env, 2, config, max_frames_per_traj=7)), Workers(spec(env, 2, config, max_frames_per_traj=7))
    for i in range(4):
        a, b = fresh.collect(2 * 25), reused.collect(2 * 25)
        if i:
            assert any(np.shares_memory(b[k], o) for k in b for o in old.values()), "an array of the last batch is reused"
        for k in a:
            assert np.array_equal(a[k], b[k]), f"batch {i}: `{k}` differs"
        reused.recycle(b)
        old = b
    fresh.close()
    reused.close()
