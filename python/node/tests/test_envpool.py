"""The EnvPool backend (``envpool:<task>`` ids, ``rollout_node.envpool_backend``), in process:
every frame the node collects is EnvPool's own loop's (one pool of all the envs, each seeded
``SEED + k``, stepped in lockstep with the node's recorded actions; its autoreset steps, whose
action EnvPool ignores, are not transitions and are dropped), key for key, for Atari and MuJoCo
tasks; runs replay by seed; what EnvPool cannot do (checkpoints) is refused by name."""

import threading

import msgpack
import numpy as np
import pytest

from conftest import node_spec
from rollout_node import wire
from rollout_node.collect import BuildError, CheckpointError, Stopped, restart_seed, restore, snapshot
from rollout_node.envpool_backend import EnvPoolEnv, EnvPoolWorkers, make_workers
from rollout_node.replay import main as replay_main
from rollout_node.replay_by_seed import check_by_seed

envpool = pytest.importorskip("envpool")

SEED = 11
RANDOM = {"config": {"kind": "random"}, "exploration": "random", "init_seed": 0}
_WIRE = {"float32": "f32", "float64": "f64", "int64": "i64", "bool": "bool", "uint8": "u8"}


def spec(task, envs, per_worker, config=None, **rollout):
    s = node_spec("envpool:" + task, envs, config, RANDOM, **{"seed": SEED, **rollout})
    s["envs_per_worker"] = per_worker
    return s


def collect(w, frames, batches):
    got = [w.collect(frames) for _ in range(batches)]
    return {k: np.concatenate([b[k] for b in got], axis=1) for k in got[0]}


def own_loop(task, config, seeds, actions):
    """EnvPool's own loop: one pool of ``len(seeds)`` envs seeded ``seeds``, every env stepped
    at every call; env ``k`` takes ``actions[k]`` in order, and any action in the step after it
    ended (EnvPool's autoreset: the action is ignored). Returns each env's transitions,
    autoreset steps left out, as ``(obs, action, next_obs, reward, terminated, truncated,
    elapsed_step)``."""
    E, T = len(seeds), len(actions[0])
    pool = envpool.make(task, env_type="gymnasium", num_envs=E, batch_size=E, seed=list(seeds), **config)
    obs, _ = pool.reset()
    ids = np.arange(E, dtype=np.int32)
    out = [[] for _ in range(E)]
    autoreset = np.zeros(E, bool)
    while min(len(o) for o in out) < T:
        act = np.stack([actions[k][min(len(out[k]), T - 1)] for k in range(E)])
        nxt, r, te, tr, info = pool.step(act, ids)
        for k in range(E):
            if autoreset[k]:  # EnvPool's reset step: no transition
                assert r[k] == 0 and not te[k] and not tr[k] and info["elapsed_step"][k] == 0
            elif len(out[k]) < T:
                out[k].append((obs[k], act[k], nxt[k], r[k], bool(te[k]), bool(tr[k]), int(info["elapsed_step"][k])))
        autoreset = ~autoreset & (te | tr)
        obs = nxt
    return out


def assert_own_loop(b, task, config, E):
    """Every frame of ``b`` is EnvPool's own loop's; returns (terminated, truncated) counts."""
    T = b["collector.traj_ids"].shape[1]
    frames = own_loop(task, config, [SEED + k for k in range(E)], b["action"])
    ends = [0, 0]
    for k in range(E):
        traj = k
        for t, (o, a, n, r, te, tr, elapsed) in enumerate(frames[k]):
            where = f"row {k} frame {t}"
            assert b["observation"][k, t].dtype == o.dtype and np.array_equal(b["observation"][k, t], o), where
            assert np.array_equal(b["action"][k, t], a), where
            assert np.array_equal(b["next.observation"][k, t], n), where
            assert b["next.reward"][k, t, 0] == np.float32(r), where
            assert bool(b["next.terminated"][k, t, 0]) == te and bool(b["next.truncated"][k, t, 0]) == tr, where
            assert bool(b["next.done"][k, t, 0]) == (te or tr), where
            assert b["step_count"][k, t, 0] == elapsed - 1, where
            assert b["collector.traj_ids"][k, t] == traj, where
            if te or tr:
                ends[0 if te else 1] += 1
                traj += E
        assert len(frames[k]) == T
    return ends


@pytest.mark.parametrize(
    "task, config, E, K, ends",
    [
        # Atari: EnvPool's defaults (84x84 gray, 4 stacked, noop and fire resets), short episodes.
        ("Pong-v5", {"max_episode_steps": 30}, 4, 2, "truncated"),
        # MuJoCo: episodes ended by the env (Hopper falls), f64 observations, box actions.
        ("Hopper-v5", {}, 3, 3, "terminated"),
        ("HalfCheetah-v5", {"max_episode_steps": 25}, 2, 1, "truncated"),
    ],
)
def test_frames_are_envpools_own_loop_key_for_key(task, config, E, K, ends):
    w = make_workers(spec(task, E, K, config))
    assert isinstance(w, EnvPoolWorkers) and len(w.pools) == E // K
    b = collect(w, E * 30, 2)
    terminated, truncated = assert_own_loop(b, task, config, E)
    assert (terminated if ends == "terminated" else truncated) > 0, "no episode ended: the test would prove little"
    w.close()


def test_a_linear_policy_after_init_random_frames_is_exact_too():
    s = spec("HalfCheetah-v5", 2, 2, {"max_episode_steps": 25}, init_random_frames=20)
    s["policy"] = {"config": {"kind": "linear"}, "exploration": "deterministic", "init_seed": 0}
    w = make_workers(s)
    rng = np.random.default_rng(3)
    w.policy.set_weights(0, {k: rng.uniform(-0.5, 0.5, v).astype(np.float32) for k, v in w.policy.layout.items()})
    b = collect(w, 2 * 20, 2)
    assert_own_loop(b, "HalfCheetah-v5", {"max_episode_steps": 25}, 2)
    # The worker's first 20 frames (10 columns of its 2 envs) are random, the rest the policy's.
    mine = w.policy.act(b["observation"][:, 10:].reshape(-1, 17).astype(np.float32)).reshape(2, 30, 6)
    assert np.array_equal(b["action"][:, 10:], mine)
    assert not np.array_equal(b["action"][:, 9], w.policy.act(b["observation"][:, 9].astype(np.float32)))
    w.close()


def test_specs_and_layout_are_envpools_spaces():
    w = make_workers(spec("Pong-v5", 2, 2, {"stack_num": 2, "img_height": 64, "img_width": 48}))
    assert w.specs == {
        "observation": {"kind": "box", "dtype": "u8", "shape": [2, 64, 48], "low": 0.0, "high": 255.0},
        "action": {"kind": "discrete", "n": 6},
    }
    b = w.collect(8)
    assert b["observation"].shape == (2, 4, 2, 64, 48) and b["observation"].dtype == np.uint8
    w.close()
    w = make_workers(spec("HalfCheetah-v5", 2, 1), double_to_float=True)
    assert w.specs["observation"]["dtype"] == "f32" and w.specs["action"]["dtype"] == "f32"
    assert w.layout()["observation"] == ["f32", [17]] and w.layout()["action"] == ["f32", [6]]
    w.close()


def write(path, batches, node=None):
    """An ``--output`` file of ``batches`` (sync records of one node, or ``node``'s async ones)."""
    with open(path, "wb") as f:
        for i, b in enumerate(batches):
            data = {k: wire.to_tensor(v if node is not None else v[None], _WIRE[v.dtype.name]) for k, v in b.items()}
            f.write(msgpack.packb({"batch": i, "node": node, "weights_version": 0, "data": data}, use_bin_type=True))


def test_runs_replay_by_seed_and_a_wrong_seed_is_named(tmp_path, capsys):
    config = {"max_episode_steps": 12}
    w = make_workers(spec("Pong-v5", 4, 2, config))
    write(tmp_path / "out", [w.collect(4 * 10) for _ in range(2)])
    assert check_by_seed(tmp_path / "out", "envpool:Pong-v5", SEED, config) == ([], 80)
    problems, _ = check_by_seed(tmp_path / "out", "envpool:Pong-v5", SEED + 1, config)
    assert len(problems) == 4 and problems[0].startswith("row 0 frame "), problems
    args = [str(tmp_path / "out"), "--env", "envpool:Pong-v5", "--seed", str(SEED), "--env-config", '{"max_episode_steps": 12}']
    assert replay_main(args) == 0
    assert "80 frames replay through EnvPool envpool:Pong-v5 by seed" in capsys.readouterr().out
    w.close()


def test_max_frames_per_traj_cuts_reset_without_a_seed_and_replay(tmp_path):
    w = make_workers(spec("HalfCheetah-v5", 2, 2, max_frames_per_traj=7))
    b = collect(w, 2 * 10, 2)
    assert b["next.truncated"][0, 6, 0] and b["step_count"][0, 7, 0] == 0 and b["collector.traj_ids"][0, 7] == 2
    write(tmp_path / "out", [b])
    assert check_by_seed(tmp_path / "out", "envpool:HalfCheetah-v5", SEED, None, 7) == ([], 40)
    w.close()


def test_a_seed_frame_rebuilds_the_pools_and_the_frames_after_it_replay_with_that_seed(tmp_path):
    w = make_workers(spec("Hopper-v5", 4, 2))
    first = w.collect(4 * 5)
    assert w.set_seed(500) == 504
    after = w.collect(4 * 20)
    assert (after["step_count"][:, 0, 0] == 0).all() and (after["collector.traj_ids"][:, 0] > first["collector.traj_ids"][:, -1]).all()
    write(tmp_path / "out", [after])
    assert check_by_seed(tmp_path / "out", "envpool:Hopper-v5", 500) == ([], 80)
    w.close()


def test_seeds_past_int32_are_taken_modulo_2_31():
    w = make_workers(spec("HalfCheetah-v5", 1, 1, seed=(1 << 31) + 5))
    b = w.collect(3)
    obs, _ = envpool.make("HalfCheetah-v5", env_type="gymnasium", num_envs=1, batch_size=1, seed=[5]).reset()
    assert np.array_equal(b["observation"][0, 0], obs[0])
    w.close()


def test_a_failing_pool_restarts_its_worker_with_restart_seeds(monkeypatch):
    w = make_workers(spec("HalfCheetah-v5", 4, 2, {"max_episode_steps": 9}))
    w.collect(4 * 3)
    pool = w.pools[1]
    real, calls = pool.send, []

    def flaky(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return real(*args)

    monkeypatch.setattr(pool, "send", flaky)
    b = w.collect(4 * 6)
    assert w.pools[1] is not pool and w.restart_count == [0, 0, 1, 1]
    # Rows 0, 1 went on; rows 2, 3 started over with their restart seeds and ids past those delivered.
    assert list(b["step_count"][0, :, 0]) == [3, 4, 5, 6, 7, 8] and list(b["step_count"][2, :, 0]) == [0, 1, 2, 3, 4, 5]
    assert list(b["collector.traj_ids"][2]) == [6] * 6 and list(b["collector.traj_ids"][3]) == [7] * 6
    for k in (2, 3):
        e = EnvPoolEnv("envpool:HalfCheetah-v5", {"max_episode_steps": 9})
        obs, _ = e.reset(seed=restart_seed(SEED + k, 1))
        for t in range(6):
            assert np.array_equal(b["observation"][k, t], obs), f"row {k} frame {t}"
            obs, r, _, _, _ = e.step(b["action"][k, t])
            assert np.array_equal(b["next.observation"][k, t], obs) and b["next.reward"][k, t, 0] == np.float32(r)
    w.close()


def test_a_stop_ends_the_batch_between_steps_and_the_next_batch_goes_on():
    w = make_workers(spec("HalfCheetah-v5", 2, 2))
    first = w.collect(2 * 4)
    stop = threading.Event()
    stop.set()
    with pytest.raises(Stopped):
        w.collect(2 * 4, stop=stop)
    after = w.collect(2 * 4)  # no step was taken: the episodes go on where the first batch left them
    assert np.array_equal(after["observation"][:, 0], first["next.observation"][:, -1])
    assert list(after["step_count"][0, :, 0]) == [4, 5, 6, 7]
    w.close()


def test_checkpoints_are_refused_naming_envpool():
    w = make_workers(spec("HalfCheetah-v5", 2, 1))
    w.collect(4)
    with pytest.raises(CheckpointError, match="runs in EnvPool"):
        snapshot(w)
    with pytest.raises(CheckpointError, match="runs in EnvPool"):
        restore(w, {"workers": []})
    w.close()


@pytest.mark.parametrize(
    "name, config, message",
    [
        ("envpool:HalfCheetah-v5", {"num_envs": 8}, "spec.env.config.num_envs cannot be given"),
        ("envpool:HalfCheetah-v5", {"seed": 3}, "spec.env.config.seed cannot be given"),
        ("envpool:NoSuchTask-v0", None, "EnvPool has no task `NoSuchTask-v0`"),
        ("envpool:HalfCheetah-v5", {"no_such_option": 1}, "cannot make env `envpool:HalfCheetah-v5`"),
    ],
)
def test_bad_envs_are_build_errors_naming_the_field(name, config, message):
    s = node_spec(name, 2, config, RANDOM)
    with pytest.raises(BuildError, match=message):
        make_workers(s)
