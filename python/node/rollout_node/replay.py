"""``python -m rollout_node.replay FILE --env NAME``: replays every frame of a ``rollout
collect --output`` file through gymnasium and fails (exit 1, naming the frame) where the
recorded next observation, reward or termination is not what gymnasium computes from the
recorded observation and action, or where the batch fields break their rules (step counts,
trajectory ids, observations carried from one frame to the next).

Two ways to replay. By state (the default): each frame's recorded observation is set as the
env's state and the recorded action stepped; only the classic-control envs whose whole state is
their observation can be replayed so: CartPole-v1, Pendulum-v1, MountainCarContinuous-v0. By
seed (``--seed S --envs-per-node E``), for any env: env ``e`` of node ``n`` was first reset with
seed ``S + n E + e`` (PROTOCOL.md §3), later resets with none, so a fresh env reset with that
seed and stepped with the row's recorded actions, batch after batch, must give every recorded
observation, reward, termination and truncation exactly (in the recorded dtype).
"""

import argparse
import sys

import gymnasium as gym
import msgpack
import numpy as np

from .wire import from_tensor


def _set_state(name, env, obs):
    u = env.unwrapped
    o = obs.astype(np.float64)
    if name == "Pendulum-v1":
        u.state = np.array([np.arctan2(o[1], o[0]), o[2]])
    else:
        u.state = o.copy()
    if hasattr(u, "steps_beyond_terminated"):
        u.steps_beyond_terminated = None  # CartPole's own "stepped past the end" bookkeeping


def records(path):
    """Every ``{batch, node, weights_version, data}`` record of ``path``, tensors as arrays."""
    with open(path, "rb") as f:
        for r in msgpack.Unpacker(f, raw=False):
            yield r["batch"], r.get("node"), r["weights_version"], {k: from_tensor(t, k) for k, t in r["data"].items()}


def check(path, name, rtol=1e-4, atol=1e-4):
    """All problems found in ``path`` (an empty list: every frame replays)."""
    env = gym.make(name)
    env.reset(seed=0)
    problems = []
    frames = 0
    last = {}  # (node, row) -> (traj_id, step_count, next_obs, done) of the row's last frame
    for batch, node, _, d in records(path):
        # Sync records stack the nodes' shares: [nodes, E, T, ...]; rows are every dim before T.
        bdims = d["collector.traj_ids"].ndim
        T = d["collector.traj_ids"].shape[-1]
        d = {k: v.reshape((-1, T) + v.shape[bdims:]) for k, v in d.items()}
        obs, act, nxt = d["observation"], d["action"], d["next.observation"]
        rew, term, done = d["next.reward"], d["next.terminated"], d["next.done"]
        ids, sc = d["collector.traj_ids"], d["step_count"]
        rows, T = obs.shape[0], obs.shape[1]
        for r in range(rows):
            for t in range(T):
                frames += 1
                where = f"batch {batch} node {node} row {r} step {t}"
                _set_state(name, env, obs[r, t])
                a = act[r, t]
                a = int(a) if np.ndim(a) == 0 else a.astype(np.float32)
                o2, rw, te, _, _ = env.unwrapped.step(a)
                if not np.allclose(o2, nxt[r, t], rtol=rtol, atol=atol):
                    problems.append(f"{where}: next.observation {nxt[r, t]} but gymnasium gives {o2}")
                if not np.isclose(rw, rew[r, t, 0], rtol=rtol, atol=atol):
                    problems.append(f"{where}: reward {rew[r, t, 0]} but gymnasium gives {rw}")
                if bool(te) != bool(term[r, t, 0]):
                    problems.append(f"{where}: terminated {term[r, t, 0]} but gymnasium gives {te}")
                key = (node, r)
                prev = last.get(key)
                if prev is not None:
                    pid, psc, pnext, pdone = prev
                    if ids[r, t] == pid:
                        if pdone or sc[r, t, 0] != psc + 1 or not np.array_equal(obs[r, t], pnext):
                            problems.append(f"{where}: trajectory {pid} does not carry on from its last frame")
                    elif sc[r, t, 0] != 0:
                        problems.append(f"{where}: a new trajectory {ids[r, t]} starts at step_count {sc[r, t, 0]}")
                elif sc[r, t, 0] != 0 and batch == 0:
                    problems.append(f"{where}: the first frame has step_count {sc[r, t, 0]}")
                last[key] = (ids[r, t], sc[r, t, 0], nxt[r, t], bool(done[r, t, 0]))
    if frames == 0:
        problems.append(f"{path} holds no frames")
    return problems, frames


def _leaves(obs, key="observation"):
    """A gymnasium observation as batch keys: a dict's leaves as ``key.name``."""
    if isinstance(obs, dict):
        out = {}
        for name, v in obs.items():
            out.update(_leaves(v, f"{key}.{name}"))
        return out
    return {key: obs}


def _env_action(space, a):
    """The recorded action ``a`` as the env takes it."""
    if isinstance(space, gym.spaces.Discrete):
        return int(a)
    if isinstance(space, gym.spaces.Box):
        return np.asarray(a, dtype=space.dtype).reshape(space.shape)
    if isinstance(space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return np.asarray(a, dtype=space.dtype).reshape(space.shape)
    raise ValueError(f"cannot replay an action of {space}")


def _same(got, recorded):
    """``got`` (the env's value) cast to the recorded dtype equals ``recorded`` exactly."""
    g = np.asarray(got).astype(recorded.dtype, copy=False).reshape(recorded.shape)
    return np.array_equal(g, recorded)


def check_seeded(path, name, seed, envs_per_node, max_frames_per_traj=None, make_kwargs=None):
    """All problems found replaying ``path`` by seed (see the module's doc): a fresh env per
    (node, row), reset with that row's seed, stepped with the recorded actions."""
    rows = {}  # (node, row) -> [env, needs_reset, first_reset_done, frames]
    problems, frames = [], 0
    obs_keys = None
    for batch, node, _, d in records(path):
        bdims = d["collector.traj_ids"].ndim
        T = d["collector.traj_ids"].shape[-1]
        if bdims == 3:  # sync: [nodes, E, T]
            nodes = d["collector.traj_ids"].shape[0]
            d = {k: v.reshape((nodes * envs_per_node, T) + v.shape[bdims:]) for k, v in d.items()}
            where_of = [(n, e) for n in range(nodes) for e in range(envs_per_node)]
        else:
            where_of = [(node, e) for e in range(d["collector.traj_ids"].shape[0])]
        if obs_keys is None:
            obs_keys = sorted(k[len("next."):] for k in d if k.startswith("next.observation"))
        for r, (n, e) in enumerate(where_of):
            if (n, e) not in rows:
                rows[(n, e)] = [gym.make(name, **(make_kwargs or {})), True, False]
            state = rows[(n, e)]
            env = state[0]
            for t in range(T):
                frames += 1
                where = f"batch {batch} node {n} env {e} step {t}"
                if state[1]:
                    o, _ = env.reset(seed=None if state[2] else seed + n * envs_per_node + e)
                    state[1], state[2] = False, True
                    for k, v in _leaves(o).items():
                        if k not in d or not _same(v, d[k][r, t]):
                            problems.append(f"{where}: {k} after reset is not gymnasium's")
                o2, rw, te, tr, _ = env.step(_env_action(env.action_space, d["action"][r, t]))
                for k, v in _leaves(o2, "next.observation").items():
                    if k not in d or not _same(v, d[k][r, t]):
                        problems.append(f"{where}: {k} is not gymnasium's")
                if not _same(rw, d["next.reward"][r, t, 0]):
                    problems.append(f"{where}: reward {d['next.reward'][r, t, 0]} but gymnasium gives {rw}")
                if bool(te) != bool(d["next.terminated"][r, t, 0]):
                    problems.append(f"{where}: terminated {d['next.terminated'][r, t, 0]} but gymnasium gives {te}")
                cut = max_frames_per_traj is not None and d["step_count"][r, t, 0] + 1 >= max_frames_per_traj
                if bool(d["next.truncated"][r, t, 0]) != ((bool(tr) or cut) and not bool(te)):
                    problems.append(f"{where}: truncated {d['next.truncated'][r, t, 0]} but gymnasium gives {tr}")
                state[1] = bool(d["next.done"][r, t, 0])
                if len(problems) > 50:
                    return problems, frames
    if frames == 0:
        problems.append(f"{path} holds no frames")
    del obs_keys
    return problems, frames


def check_actions(path, name, spec, weights_file):
    """Frames whose recorded action is not exactly what this node's policy computes for the
    recorded observation with the weights in ``weights_file`` (a MessagePack ``Weights``)."""
    from .collect import _action_space, _obs_dim
    from .policy import Policy
    from .wire import weights_from_wire

    env = gym.make(name)
    with open(weights_file, "rb") as f:
        version, tensors = weights_from_wire(msgpack.unpackb(f.read(), raw=False))
    policy = Policy(spec, _obs_dim(env.observation_space), _action_space(env.action_space), 0)
    policy.set_weights(version, tensors)
    problems, frames = [], 0
    for batch, node, _, d in records(path):
        T = d["collector.traj_ids"].shape[-1]
        obs = d["observation"].reshape(-1, d["observation"].shape[-1])
        act = d["action"].reshape((obs.shape[0],) + d["action"].shape[d["collector.traj_ids"].ndim:])
        mine = policy.act(obs)
        bad = np.nonzero((mine != act).reshape(obs.shape[0], -1).any(axis=1))[0]
        for i in bad[:5]:
            problems.append(f"batch {batch} node {node} frame {i}: recorded action {act[i]}, this node computes {mine[i]}")
        frames += obs.shape[0]
        del T
    return problems, frames


def main(argv=None):
    """Exit 0 when every frame replays, 1 otherwise (problems on stderr)."""
    p = argparse.ArgumentParser(prog="python -m rollout_node.replay")
    p.add_argument("file")
    p.add_argument("--env", required=True)
    p.add_argument("--weights", help="with --policy: check every action against this node's policy with these weights")
    p.add_argument("--policy", help="the run's PolicySpec as JSON, e.g. '{\"config\": {\"kind\": \"linear\"}, \"exploration\": \"deterministic\"}'")
    p.add_argument("--seed", type=int, help="replay by seed, any env: the run's --seed")
    p.add_argument("--envs-per-node", type=int, default=1, help="with --seed: the run's --envs-per-node")
    p.add_argument("--max-frames-per-traj", type=int, help="with --seed: the run's --max-frames-per-traj")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (it registers envs); repeatable")
    args = p.parse_args(argv)
    import importlib

    for m in args.imports:
        importlib.import_module(m)
    if args.seed is not None:
        problems, frames = check_seeded(args.file, args.env, args.seed, args.envs_per_node, args.max_frames_per_traj)
        for line in problems[:20]:
            print(line, file=sys.stderr)
        if problems:
            print(f"{len(problems)} problems in {frames} frames", file=sys.stderr)
            return 1
        print(f"{frames} frames replay through gymnasium {args.env} by seed")
        return 0
    if args.weights:
        import json

        problems, frames = check_actions(args.file, args.env, json.loads(args.policy), args.weights)
        for line in problems[:20]:
            print(line, file=sys.stderr)
        if problems:
            print(f"{len(problems)} actions differ in {frames} frames", file=sys.stderr)
            return 1
        print(f"{frames} actions are this node's")
        return 0
    problems, frames = check(args.file, args.env)
    for line in problems[:20]:
        print(line, file=sys.stderr)
    if problems:
        print(f"{len(problems)} problems in {frames} frames", file=sys.stderr)
        return 1
    print(f"{frames} frames replay through gymnasium {args.env}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
