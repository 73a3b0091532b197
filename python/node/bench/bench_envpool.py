"""The Python node's EnvPool backend against EnvPool's own loop, in the same process and run
(BENCHMARKS.md, "EnvPool backend"; issue 43: goal >= 0.9).

    PYTHONPATH=python/node .venv/bin/python python/node/bench/bench_envpool.py \
        [--task Pong-v5] [--envs 8] [--frames 8000] [--batch 2000] [--rounds 3] [--config JSON]

Alternating round by round, it times
* `envpool`: EnvPool's own loop: one pool of K envs (`num_envs = batch_size = K`, seeded),
  `reset()`, then `step(actions, env_ids)` with K uniform random actions drawn by numpy each
  step, for N / K steps (N frames; its autoreset steps count as frames: they cost a step);
* `rollout`: the node's collection (`Workers.collect` of an `envpool:<task>` spec, one worker
  of K envs, the `random` policy) of N / B batches of B frames, every batch field filled and
  its arrays recycled as a session does once a batch is sent;
and prints each round's frames/s per second of wall time and per second of this process's CPU
time (EnvPool's threads included), the medians and the ratios rollout / envpool. On a machine
shared with other work the wall-time figures move with the load, the CPU-time ones less.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rollout_node.envpool_backend import make_workers  # noqa: E402


def spec(task, envs, batch, config, seed):
    """A node spec of one worker of ``envs`` EnvPool envs acting at random."""
    return {
        "index": 0, "env": {"name": "envpool:" + task, "config": config},
        "policy": {"config": {"kind": "random"}, "exploration": "random", "init_seed": 0},
        "envs_per_node": envs, "envs_per_worker": envs, "first_lane": 0, "lanes": envs,
        "rollout": {"frames_per_batch": batch, "max_frames_per_traj": None, "reset_at_each_iter": False,
                    "init_random_frames": 0, "seed": seed, "nan_is_failure": False},
    }


def own_loop(task, envs, frames, config, seed):
    """Frames/s of EnvPool's own loop with random actions."""
    import envpool

    pool = envpool.make(task, env_type="gymnasium", num_envs=envs, batch_size=envs, seed=seed, **config)
    space = pool.action_space
    rng = np.random.default_rng(seed)
    ids = np.arange(envs, dtype=np.int32)
    if hasattr(space, "n"):
        def act():
            return rng.integers(0, space.n, envs)
    else:
        low, high = np.broadcast_to(space.low, space.shape), np.broadcast_to(space.high, space.shape)

        def act():
            return rng.uniform(low, high, (envs,) + space.shape).astype(np.float32)
    pool.reset()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(frames // envs):
        pool.step(act(), ids)
    n = frames // envs * envs
    return n / (time.perf_counter() - t), n / (time.process_time() - c)


def node_loop(task, envs, frames, batch, config, seed):
    """Frames/s of the node's collection through the EnvPool backend."""
    w = make_workers(spec(task, envs, batch, config, seed))
    w.recycle(w.collect(batch))  # the first reset, and the batch arrays, outside the timing
    t, c = time.perf_counter(), time.process_time()
    for _ in range(frames // batch):
        w.recycle(w.collect(batch))
    n = frames // batch * batch
    fps = n / (time.perf_counter() - t), n / (time.process_time() - c)
    w.close()
    return fps


def main():
    """Prints each round's figures, the medians and the ratio."""
    p = argparse.ArgumentParser(prog="bench_envpool.py")
    p.add_argument("--task", default="Pong-v5", help="an EnvPool task id (envpool.list_all_envs())")
    p.add_argument("--envs", type=int, default=8, help="K: envs of the one pool (EnvPool's num_envs)")
    p.add_argument("--frames", type=int, default=8000, help="frames per round and loop")
    p.add_argument("--batch", type=int, default=2000, help="frames per batch of the node")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--config", default="{}", help="envpool.make keyword arguments, JSON")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    config = json.loads(a.config)
    if a.batch % a.envs or a.frames % a.batch:
        p.error("--batch must be a multiple of --envs, and --frames of --batch")
    print(f"{a.task} K={a.envs} config={config} frames={a.frames} batch={a.batch} load={os.getloadavg()[0]:.2f}")
    own, node = [], []
    for r in range(a.rounds):
        own.append(own_loop(a.task, a.envs, a.frames, config, a.seed + r))
        node.append(node_loop(a.task, a.envs, a.frames, a.batch, config, a.seed + r))
        (ow, oc), (nw, nc) = own[-1], node[-1]
        print(f"round {r}: wall: envpool {ow:,.0f} frames/s, rollout {nw:,.0f}, ratio {nw / ow:.3f}; "
              f"CPU: envpool {oc:,.0f}, rollout {nc:,.0f}, ratio {nc / oc:.3f}")
    for i, what in enumerate(("wall", "CPU")):
        mo, mn = statistics.median(o[i] for o in own), statistics.median(n[i] for n in node)
        ratios = statistics.median(n[i] / o[i] for n, o in zip(node, own))
        print(f"median ({what}): envpool {mo:,.0f} frames/s, rollout {mn:,.0f} frames/s, ratio {mn / mo:.3f} "
              f"(median of round ratios {ratios:.3f})")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
