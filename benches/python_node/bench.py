"""The Python node's collection speed against gymnasium's own vector-env loop with the same
numpy policy, in the same process and run (BENCHMARKS.md, "Python node").

    .venv/bin/python benches/python_node/bench.py [--frames N] [--rounds R] [--env ID]
        [--policy linear|random] [--envs 1,8]

For each env count E (`--envs`, default 1 and 8) it times, alternately, R rounds of
* `gymnasium`: SyncVectorEnv(E) of the env (`--env`, default CartPole-v1; `ALE/...` ids need
  ale-py, MuJoCo ones mujoco), `obs = vec.reset(seed)`, then
  `a = policy.act(obs); obs, ... = vec.step(a)` for N / E steps, with its default (next-step)
  autoreset: the reset-only step after each episode's end is not counted as a frame;
* `gymnasium same-step`: the same loop with `autoreset_mode=SAME_STEP` (the node's: an env
  that ends is reset inside that step, so no step is spent on a reset alone);
* `node`: the node's own collection of one N-frame batch (`Workers.collect`: resets, policy,
  stepping and every batch field filled), as it answers a `continue`; with `--batch B`, N / B
  batches of B frames; with `--wire`, each batch also made into the frame's buffers as the
  node sends it (`wire.encode_parts`, no socket) and its arrays recycled once "sent", as the
  node's session does;
and prints the median frames/s of each, the node's ratio to each and to the faster of the two
gymnasium loops (the one the target is checked against), and the load average before and
after. Frames/s are per second of wall time and, in a second table, per second of this
process's CPU time: on a machine shared with other work the wall-time figures move with the
load, the CPU-time ones much less (every loop is single-threaded, in this one process). The
policy is the node's deterministic linear policy with fixed weights (`--policy random`: its
random policy, for an image observation), the same object in every loop; the gymnasium loops
cast the observation to f32 for it only when it is a network and the env's is not f32.
"""

import argparse
import os
import statistics
import time

import gymnasium as gym
import numpy as np

from rollout_node.collect import Workers
from rollout_node.session import _DTYPES
from rollout_node.wire import encode_parts, tensor_view


def spec(envs, frames, env="CartPole-v1", policy="linear"):
    return {
        "index": 0, "env": {"name": env, "config": None},
        "policy": {"config": {"kind": policy}, "exploration": "deterministic", "init_seed": 0},
        "envs_per_node": envs, "first_lane": 0, "lanes": envs,
        "rollout": {"frames_per_batch": frames, "max_frames_per_traj": None, "reset_at_each_iter": False,
                    "init_random_frames": 0, "seed": 1, "nan_is_failure": False},
    }


def weights(policy):
    rng = np.random.default_rng(0)
    return {k: rng.uniform(-0.5, 0.5, s).astype(np.float32) for k, s in policy.layout.items()}


def gym_loop(envs, frames, policy, mode=gym.vector.AutoresetMode.NEXT_STEP, env="CartPole-v1"):
    """Frames/s of gymnasium's loop, counting real transitions only: with its default
    (next-step) autoreset, the step after an episode's end only resets and is no frame; with
    same-step autoreset every step is one."""
    vec = gym.vector.SyncVectorEnv([lambda: gym.make(env) for _ in range(envs)], autoreset_mode=mode)
    cast = policy.kind != "random"
    same = mode == gym.vector.AutoresetMode.SAME_STEP
    obs, _ = vec.reset(seed=1)
    real = 0
    ended = np.zeros(envs, bool)
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(frames // envs):
        a = policy.act(np.asarray(obs, np.float32) if cast else obs)
        obs, _, term, trunc, _ = vec.step(a)
        real += envs - int(ended.sum())
        if not same:
            ended = term | trunc
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    vec.close()
    return real / dt, real / dc


def node_loop(workers, frames, batch=None, wire=False):
    batch = batch or frames
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(frames // batch):
        b = workers.collect(batch)
        if wire:
            tensors = {k: tensor_view(a, _DTYPES[a.dtype.name]) for k, a in b.items()}
            encode_parts({"type": "batch", "node": 0, "seq": 1, "weights_version": 0,
                          "data": {"batch_size": [workers.E, batch // workers.E], "tensors": tensors}})
            workers.recycle(b)
    frames = frames // batch * batch
    return frames / (time.perf_counter() - t0), frames / (time.process_time() - c0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--frames", type=int, default=40_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--policy", default="linear", choices=["linear", "random"])
    p.add_argument("--envs", default="1,8", help="env counts, comma-separated")
    p.add_argument("--batch", type=int, help="frames per node batch [default: --frames]")
    p.add_argument("--wire", action="store_true", help="the node also encodes each batch and recycles its arrays")
    args = p.parse_args()
    print(f"env {args.env}, policy {args.policy}, node batches of {args.batch or args.frames} frames"
          + (", encoded and recycled" if args.wire else ""))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows = []
    for envs in (int(e) for e in args.envs.split(",")):
        w = Workers(spec(envs, args.frames, args.env, args.policy))
        w.policy.set_weights(0, weights(w.policy))
        node_loop(w, args.batch or args.frames, None, args.wire)  # warm up: first resets
        g, s, n = [], [], []
        for _ in range(args.rounds):
            g.append(gym_loop(envs, args.frames, w.policy, env=args.env))
            s.append(gym_loop(envs, args.frames, w.policy, gym.vector.AutoresetMode.SAME_STEP, args.env))
            n.append(node_loop(w, args.frames, args.batch, args.wire))
        rows.append((envs, g, s, n))
        w.close()
    for clock, i in (("wall", 0), ("CPU", 1)):
        print(f"\nframes/s of {clock} time, median of {args.rounds} rounds")
        print("| envs_per_node | gymnasium loop | gymnasium same-step | Python node "
              "| node / gymnasium | node / same-step | node / faster |")
        print("|---|---|---|---|---|---|---|")
        for envs, g, s, n in rows:
            gm, sm, nm = (statistics.median(x[i] for x in v) for v in (g, s, n))
            print(f"| {envs} | {gm:,.0f} | {sm:,.0f} | {nm:,.0f} | {nm / gm:.2f} | {nm / sm:.2f} | {nm / max(gm, sm):.2f} |")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
