"""Replays a PettingZoo env's frames by seed (``replay_by_seed`` for ``pettingzoo:`` ids):
row ``r`` of a run was first reset with ``seed + r`` and later reset without a seed, so a
fresh ParallelEnv reset so and stepped with the recorded actions of the present agents must
give every recorded mask, observation, next observation, reward and flag (floats within 1e-6;
an f64 observation kept f64 exactly), with zeros for agents not present, an agent the step
returned no flags for terminated and truncated, the cut (``max_frames_per_traj``) truncating
every agent, and the env's flags those of every agent, or of any agent in a run with
``done_on_any`` (PROTOCOL.md §3, Multi-agent envs).

It reads rows as ``{key: [frames, ...]}`` (``replay_by_seed._rows`` of an ``--output`` file, or
:func:`rows_of` of batches the node collected). It holds for runs seeded once at the start,
without worker restarts, as for gymnasium's envs.
"""

import numpy as np

from . import marl_spaces
from .pettingzoo_backend import factory
from .replay_by_seed import same_values


def rows_of(batches):
    """``{row: {key: [frames, ...]}}`` of in-process batches (``[E, T, ...]`` each), in order."""
    E = batches[0]["collector.traj_ids"].shape[0]
    return {r: {k: np.concatenate([b[k][r] for b in batches]) for k in batches[0]} for r in range(E)}


def _leaf(obs, suffix):
    for name in suffix.split(".")[1:]:
        obs = obs[name]
    return np.asarray(obs)


def _differs(got, want):
    """Why ``got`` (recorded) is not ``want`` (PettingZoo's), or None."""
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, PettingZoo's {list(want.shape)}"
    return None if same_values(got, want) else f"{got}, PettingZoo gives {want}"


class _Row:
    """One row's frames and its group's keys."""

    def __init__(self, data, groups):
        self.data, self.groups = data, groups
        #: ``{g: [(obs key, suffix)]}``.
        self.obs_keys = {g: [(k, k[len(g) + len(".observation"):]) for k in sorted(data)
                             if k == f"{g}.observation" or k.startswith(f"{g}.observation.")] for g in groups}

    def observations(self, head, t, obs, present):
        """What differs between the recorded ``head + g.observation...`` at frame ``t`` and
        ``obs`` of the agents of ``present`` that ``obs`` holds (zeros for the others)."""
        for g, agents in self.groups.items():
            for key, suffix in self.obs_keys[g]:
                rec = self.data[head + key][t]
                for j, a in enumerate(agents):
                    want = _leaf(obs[a], suffix) if a in present and a in obs else np.zeros_like(rec[j])
                    why = _differs(rec[j], want)
                    if why:
                        return f"`{head}{key}` of {a}: {why}"
        return None


def check_row(data, make, seed, max_frames_per_traj=None, done_on_any=False):
    """``(problem or None, frames checked)`` of one row's frames (``{key: [frames, ...]}``)."""
    env = make()
    groups = {g: a for g, a in sorted(marl_spaces.group_map(list(env.possible_agents)).items())}
    row = _Row(data, groups)
    obs, _ = env.reset(seed=seed)
    sc = 0
    n = len(data["collector.traj_ids"])
    try:
        for t in range(n):
            why = _frame(row, env, t, obs, sc, max_frames_per_traj, done_on_any)
            if isinstance(why, str):
                return f"frame {t}: {why}", t + 1
            obs, done = why
            if done:
                obs, _ = env.reset()
                sc = 0
            else:
                sc += 1
        return None, n
    finally:
        env.close()


def _frame(row, env, t, obs, sc, max_traj, done_on_any):
    """Checks frame ``t``: a reason (str) or ``(next observation, done)``."""
    d = row.data
    present = set(env.agents)
    for g, agents in row.groups.items():
        want = np.array([a in present for a in agents])
        if not np.array_equal(d[f"{g}.mask"][t], want):
            return f"`{g}.mask` is {d[f'{g}.mask'][t]}, PettingZoo's agents are {sorted(present)}"
    why = row.observations("", t, obs, present)
    if why:
        return why
    if d["step_count"][t, 0] != sc:
        return f"step_count {d['step_count'][t, 0]}, expected {sc}"
    actions = {}
    for g, agents in row.groups.items():
        for j, a in enumerate(agents):
            if a in present:
                v = d[f"{g}.action"][t, j]
                actions[a] = int(v) if np.ndim(v) == 0 else v
    nxt, rew, te, tr, _ = env.step(actions)
    why = row.observations("next.", t, nxt, set(nxt))
    if why:
        return why
    cut = max_traj is not None and sc + 1 >= max_traj
    after = set(env.agents)
    every = []
    for g, agents in row.groups.items():
        want_mask = np.array([a in after for a in agents])
        if not np.array_equal(d[f"next.{g}.mask"][t], want_mask):
            return f"`next.{g}.mask` is {d[f'next.{g}.mask'][t]}, PettingZoo's agents after the step are {sorted(after)}"
        for j, a in enumerate(agents):
            r = float(rew.get(a, 0.0))
            # An agent the step returned no flags for has left (or not come): both.
            flags = (bool(te.get(a, True)), bool(tr.get(a, True)) or cut)
            every.append(flags)
            got_r = float(d[f"next.{g}.reward"][t, j, 0])
            if abs(got_r - r) > 1e-6 * max(1.0, abs(r)):
                return f"reward of {a} {got_r}, PettingZoo gives {r}"
            got = (bool(d[f"next.{g}.terminated"][t, j, 0]), bool(d[f"next.{g}.truncated"][t, j, 0]), bool(d[f"next.{g}.done"][t, j, 0]))
            if got != (*flags, flags[0] or flags[1]):
                return f"terminated, truncated, done of {a} {got}, PettingZoo gives {(*flags, flags[0] or flags[1])}"
    rule = any if done_on_any else all
    done = not after or cut or rule(a or b for a, b in every)
    want = (done, done and rule(a for a, _ in every), done and rule(b for _, b in every))
    got = (bool(d["next.done"][t, 0]), bool(d["next.terminated"][t, 0]), bool(d["next.truncated"][t, 0]))
    if got != want:
        return f"next.done, terminated, truncated {got}, PettingZoo gives {want}"
    return nxt, done


def check_rows(rows, name, seed, config=None, max_frames_per_traj=None, done_on_any=False):
    """``(problems, frames)`` of ``rows`` (``{row: {key: [frames, ...]}}``) of a ``pettingzoo:``
    env ``name`` (its episodes ending once any agent is done where ``done_on_any``): the
    first problem of each row that does not replay."""
    make = factory(name, config)
    problems, frames = [], 0
    for r in sorted(rows):
        why, _ = check_row(rows[r], make, seed + r, max_frames_per_traj, done_on_any)
        frames += len(rows[r]["collector.traj_ids"])
        if why:
            problems.append(f"row {r} {why}")
    return problems, frames
