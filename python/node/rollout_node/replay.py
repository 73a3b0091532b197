"""``python -m rollout_node.replay FILE --env NAME``: replays every frame of a ``rollout
collect --output`` file through gymnasium and fails (exit 1, naming the frame) where the
recorded next observation, reward or termination is not what gymnasium computes from the
recorded observation and action, or where the batch fields break their rules (step counts,
trajectory ids, observations carried from one frame to the next).

Only the classic-control envs whose whole state is their observation can be replayed so:
CartPole-v1, Pendulum-v1, MountainCarContinuous-v0. With ``--seed S`` any env is, by seed
(``replay_by_seed``): row ``r`` of the run reset with ``S + r``, stepped with the recorded
actions (``--env-config JSON`` as the run's, ``--max-frames-per-traj N`` as the run's);
``envpool:<task>`` ids too, through EnvPool; ``pettingzoo:<module>`` ids through PettingZoo
(``marl_replay``); a pickled torchrl env by seed too,
``--pickled-env PKL`` instead of ``--env``.
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


def check_actions(path, name, spec, weights_file):
    """Frames whose recorded action is not exactly what this node's policy computes for the
    recorded observation with the weights in ``weights_file`` (a MessagePack ``Weights``)."""
    from .policy import ActionSpace, Policy
    from .wire import weights_from_wire

    env = gym.make(name)
    with open(weights_file, "rb") as f:
        version, tensors = weights_from_wire(msgpack.unpackb(f.read(), raw=False))
    obs_dim = int(np.prod(env.observation_space.shape, dtype=np.int64))
    policy = Policy(spec, obs_dim, ActionSpace.of(env.action_space), 0)
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
    p.add_argument("--env", help="the run's env id (or --pickled-env)")
    p.add_argument("--pickled-env", metavar="PKL",
                   help="with --seed: a torchrl env function (or env) saved with cloudpickle.dump, as the run pickled it")
    p.add_argument("--weights", help="with --policy: check every action against this node's policy with these weights")
    p.add_argument("--policy", help="the run's PolicySpec as JSON, e.g. '{\"config\": {\"kind\": \"linear\"}, \"exploration\": \"deterministic\"}'")
    p.add_argument("--seed", type=int, help="replay any env by seed: row r was first reset with SEED + r")
    p.add_argument("--env-config", help="with --seed: the run's env config (JSON), passed to gymnasium.make")
    p.add_argument("--max-frames-per-traj", type=int, help="with --seed: the run's max_frames_per_traj")
    p.add_argument("--done-on-any", action="store_true", help="with --seed, a pettingzoo: env: the run's episodes ended once any agent was done")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (it registers envs with gymnasium); repeatable")
    args = p.parse_args(argv)
    if (args.env is None) == (args.pickled_env is None) or (args.pickled_env is not None and args.seed is None):
        p.error("give --env, or --pickled-env with --seed")
    if args.pickled_env is not None:
        from .torchrl_env import PICKLED_ENV, config_of

        with open(args.pickled_env, "rb") as f:
            args.env, args.env_config = PICKLED_ENV, config_of(f.read())
    import importlib

    for m in args.imports:
        importlib.import_module(m)
    if args.env.startswith("ALE/"):
        from .collect import _import_for

        _import_for(args.env)
    if args.seed is not None:
        import json

        from .replay_by_seed import check_by_seed

        config = json.loads(args.env_config) if isinstance(args.env_config, str) else args.env_config
        problems, frames = check_by_seed(args.file, args.env, args.seed, config, args.max_frames_per_traj, args.done_on_any)
        for line in problems[:20]:
            print(line, file=sys.stderr)
        if problems:
            print(f"{len(problems)} rows do not replay ({frames} frames)", file=sys.stderr)
            return 1
        if args.pickled_env is not None:
            what = "the pickled torchrl env"
        else:
            lib = {"envpool:": "EnvPool", "pettingzoo:": "PettingZoo"}.get(args.env.partition(":")[0] + ":", "gymnasium")
            what = f"{lib} {args.env}"
        print(f"{frames} frames replay through {what} by seed")
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
