"""Replays a ``rollout collect --output`` file of any gymnasium env by seed: row ``r`` of the
run (node by node, a node's envs in order) was first reset with ``seed + r``, later resets
pass no seed, so a fresh env reset with that seed and stepped with the recorded actions must
give every recorded observation, reward, termination and truncation (floats within 1e-6;
an f64 observation kept f64 exactly). This is how MuJoCo or Atari frames are checked, whose
state cannot be set from an observation (``python -m rollout_node.replay FILE --env ID
--seed S``).

A pickled torchrl env (``name`` ``torchrl_env.PICKLED_ENV``, ``config`` its spec's config;
``python -m rollout_node.replay FILE --pickled-env PKL --seed S`` with PKL a file of
``cloudpickle.dump(make_env, f)``) is replayed as the node stepped it: ``set_seed(seed + r)``,
``reset()``, ``step`` with the recorded actions.

It holds for a run whose envs were seeded once, at the start, with the seed chain starting at
``seed`` (the trainer's ``seed``, ``rollout.seed`` for a node alone), and that no worker
restarted: a restart reseeds its env, a ``seed`` frame cuts every episode.

A PettingZoo id (``pettingzoo:mpe2.simple_spread_v3``) replays through PettingZoo itself
(``marl_replay``: every agent's mask, observations, rewards and flags).

An EnvPool id (``envpool:Pong-v5``, ``envpool_backend``) replays the same way through a pool
of one env seeded ``(seed + r) mod 2^31``: EnvPool gives each env a generator of its own, so
env ``r`` of a node's pool is that env.
"""

import gymnasium as gym
import numpy as np

from . import torchrl_env
from .envpool_backend import EnvPoolEnv, is_envpool
from .replay import records


def make_env(name, config=None):
    """A fresh env ``name`` with ``config``: gymnasium's, or EnvPool's for an ``envpool:`` id."""
    if is_envpool(name):
        return EnvPoolEnv(name, config)
    return gym.make(name, **(config or {}))


def _rows(path):
    """``{row: {key: [frames, ...]}}``: each env's frames in order, over all records."""
    rows = {}
    for _, node, _, d in records(path):
        ids = d["collector.traj_ids"]
        T, bdims = ids.shape[-1], ids.ndim
        flat = {k: v.reshape((-1, T) + v.shape[bdims:]) for k, v in d.items()}
        n = flat["collector.traj_ids"].shape[0]
        base = 0 if node is None else node * n  # a node's own record: its rows of the run
        for i in range(n):
            rows.setdefault(base + i, []).append({k: v[i] for k, v in flat.items()})
    return {r: {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} for r, parts in rows.items()}


def _leaf(obs, suffix):
    for name in suffix.split(".")[1:]:
        obs = obs[name]
    return np.asarray(obs)


def _obs_problem(data, head, t, obs):
    """What differs between the recorded entries under ``head`` at frame ``t`` and ``obs``."""
    for key, rec in data.items():
        if not (key == head or key.startswith(head + ".")):
            continue
        got, want = rec[t], _leaf(obs, key[len(head):])
        if got.shape != want.shape:
            return f"`{key}` has shape {list(got.shape)}, gymnasium's {list(want.shape)}"
        if not same_values(got, want):
            return f"`{key}` is {got}, gymnasium gives {want}"
    return None


def same_values(got, want):
    """Whether recorded ``got`` is the env's ``want`` (of one shape): floats taken as f32
    (``DoubleToFloat``) within 1e-6, anything else exactly."""
    if got.dtype == np.float32 and want.dtype == np.float64:
        return np.allclose(got, want, rtol=1e-6, atol=1e-6)
    return np.array_equal(got.astype(np.float64), want.astype(np.float64))


def check_by_seed(path, name, seed, config=None, max_frames_per_traj=None, done_on_any=False):
    """``(problems, frames)``: the first problem of each row of ``path`` (an empty list:
    every frame replays); ``done_on_any``: a multi-agent run's episodes ended once any agent
    was done."""
    problems, frames = [], 0
    rows = _rows(path)
    if isinstance(name, str) and name.startswith("pettingzoo:"):
        from .marl_replay import check_rows  # pettingzoo imported only for these ids

        problems, frames = check_rows(rows, name, seed, config, max_frames_per_traj, done_on_any)
        if frames == 0:
            problems.append(f"{path} holds no frames")
        return problems, frames
    if name == torchrl_env.PICKLED_ENV:
        make = torchrl_env.factory(config, allowed=True)  # the caller's own pickle
    else:
        def make():
            return make_env(name, config)
    for r in sorted(rows):
        data = rows[r]
        env = make()
        obs, _ = env.reset(seed=seed + r)
        sc = 0
        for t in range(len(data["collector.traj_ids"])):
            frames += 1
            where = f"row {r} frame {t}"
            why = _obs_problem(data, "observation", t, obs)
            if why is None and data["step_count"][t, 0] != sc:
                why = f"step_count {data['step_count'][t, 0]}, expected {sc}"
            if why is None:
                a = data["action"][t]
                nxt, rew, te, tr, _ = env.step(int(a) if a.ndim == 0 else a)
                cut = max_frames_per_traj is not None and sc + 1 >= max_frames_per_traj and not te
                got = (bool(data["next.terminated"][t, 0]), bool(data["next.truncated"][t, 0]))
                why = _obs_problem(data, "next.observation", t, nxt)
                if why is None and abs(float(data["next.reward"][t, 0]) - rew) > 1e-6 * max(1.0, abs(rew)):
                    why = f"reward {data['next.reward'][t, 0]}, gymnasium gives {rew}"
                if why is None and got != (bool(te), bool(tr) or cut):
                    why = f"terminated, truncated {got}, gymnasium gives {(bool(te), bool(tr) or cut)}"
            if why is not None:
                problems.append(f"{where}: {why}")
                frames += len(data["collector.traj_ids"]) - t - 1
                break
            sc += 1
            obs = nxt
            if te or tr or cut:
                obs, _ = env.reset()
                sc = 0
        env.close()
    if frames == 0:
        problems.append(f"{path} holds no frames")
    return problems, frames
