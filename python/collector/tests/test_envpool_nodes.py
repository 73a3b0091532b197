"""An ``envpool:<task>`` run through ``rollout.DistributedCollector``: the default launcher starts
Python nodes for it, and every frame of the run is EnvPool's own loop's (one pool of all the
run's envs, env ``r`` seeded ``seed + r``, stepped in lockstep with the recorded actions; its
autoreset steps, whose action EnvPool ignores, are not transitions), key for key."""

import numpy as np
import pytest

import rollout
from conftest import require_python_node

envpool = pytest.importorskip("envpool")

SEED = 5


def own_loop(task, config, seeds, actions):
    """Each env's transitions in EnvPool's own loop with ``actions[k]`` for env ``k``, autoreset
    steps left out: ``(obs, next_obs, reward, terminated, truncated, elapsed_step)``."""
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
            if not autoreset[k] and len(out[k]) < T:
                out[k].append((obs[k], nxt[k], r[k], bool(te[k]), bool(tr[k]), int(info["elapsed_step"][k])))
        autoreset = ~autoreset & (te | tr)
        obs = nxt
    return out


def flat(d, prefix=""):
    """A batch's nested dict of arrays as ``{"next.reward": array, ...}`` (copies)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, prefix + k + "."))
        else:
            out[prefix + k] = np.array(v)
    return out


@pytest.mark.parametrize("task, config", [("Pong-v5", {"max_episode_steps": 20}), ("Hopper-v5", {})])
def test_a_run_of_python_nodes_on_envpool_is_envpools_own_loop(task, config):
    require_python_node()
    with rollout.DistributedCollector(
        "envpool:" + task, "random", env_config=config, nodes=2, envs_per_node=2, envs_per_worker=2,
        sync=True, frames_per_batch=2 * 2 * 15, total_frames=2 * 2 * 45, seed=SEED,
    ) as c:
        batches = [flat(b.to_dict()) for b in c]
    # Sync batches are [nodes, envs, T, ...]: row r = node * 2 + env, as the seed chain counts.
    b = {k: np.concatenate([x[k] for x in batches], axis=2) for k in batches[0]}
    b = {k: v.reshape((4,) + v.shape[2:]) for k, v in b.items()}
    frames = own_loop(task, config, [SEED + r for r in range(4)], b["action"])
    ends_of = [0] * 4
    for r in range(4):
        for t, (o, n, rew, te, tr, elapsed) in enumerate(frames[r]):
            where = f"row {r} frame {t}"
            assert np.array_equal(b["observation"][r, t], o), where
            assert np.array_equal(b["next.observation"][r, t], n), where
            assert b["next.reward"][r, t, 0] == np.float32(rew), where
            assert (bool(b["next.terminated"][r, t, 0]), bool(b["next.truncated"][r, t, 0])) == (te, tr), where
            assert b["step_count"][r, t, 0] == elapsed - 1, where
            assert b["collector.traj_ids"][r, t] == r + 4 * ends_of[r], where
            ends_of[r] += te or tr
    assert sum(ends_of) > 0, "no episode ended: the test would prove little"
