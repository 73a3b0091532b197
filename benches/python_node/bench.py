"""The Python node's collection speed against gymnasium's own vector-env loop with the same
numpy policy, in the same process and run (BENCHMARKS.md, "Python node").

    .venv/bin/python benches/python_node/bench.py [--frames N] [--rounds R]

For each env count E (1 and 8) it times, alternately, R rounds of
* `gymnasium`: SyncVectorEnv(E) of CartPole-v1, `obs = vec.reset(seed)`, then
  `a = policy.act(obs); obs, ... = vec.step(a)` for N / E steps, with its default (next-step)
  autoreset: the reset-only step after each episode's end is not counted as a frame;
* `gymnasium same-step`: the same loop with `autoreset_mode=SAME_STEP` (the node's: an env
  that ends is reset inside that step, so no step is spent on a reset alone);
* `node`: the node's own collection of one N-frame batch (`Workers.collect`: resets, policy,
  stepping and every batch field filled), as it answers a `continue`;
and prints the median frames/s of each, the node's ratio to each and to the faster of the two
gymnasium loops (the one the target is checked against), and the load average before and
after. The policy is the node's deterministic linear policy with fixed weights, the same
object in every loop.
"""

import argparse
import os
import statistics
import time

import gymnasium as gym
import numpy as np

from rollout_node.collect import Workers


def spec(envs, frames):
    return {
        "index": 0, "env": {"name": "CartPole-v1", "config": None},
        "policy": {"config": {"kind": "linear"}, "exploration": "deterministic", "init_seed": 0},
        "envs_per_node": envs, "first_lane": 0, "lanes": envs,
        "rollout": {"frames_per_batch": frames, "max_frames_per_traj": None, "reset_at_each_iter": False,
                    "init_random_frames": 0, "seed": 1, "nan_is_failure": False},
    }


def weights():
    rng = np.random.default_rng(0)
    return {"weight": rng.uniform(-0.5, 0.5, (2, 4)).astype(np.float32),
            "bias": rng.uniform(-0.5, 0.5, (2,)).astype(np.float32)}


def gym_loop(envs, frames, policy, mode=gym.vector.AutoresetMode.NEXT_STEP):
    """Frames/s of gymnasium's loop, counting real transitions only: with its default
    (next-step) autoreset, the step after an episode's end only resets and is no frame; with
    same-step autoreset every step is one."""
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(envs)], autoreset_mode=mode)
    same = mode == gym.vector.AutoresetMode.SAME_STEP
    obs, _ = vec.reset(seed=1)
    real = 0
    ended = np.zeros(envs, bool)
    t0 = time.perf_counter()
    for _ in range(frames // envs):
        a = policy.act(np.asarray(obs, np.float32))
        obs, _, term, trunc, _ = vec.step(a)
        real += envs - int(ended.sum())
        if not same:
            ended = term | trunc
    dt = time.perf_counter() - t0
    vec.close()
    return real / dt


def node_loop(workers, frames):
    t0 = time.perf_counter()
    workers.collect(frames)
    return frames / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--frames", type=int, default=40_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| envs_per_node | gymnasium loop | gymnasium same-step | Python node "
          "| node / gymnasium | node / same-step | node / faster |")
    print("|---|---|---|---|---|---|---|")
    for envs in (1, 8):
        w = Workers(spec(envs, args.frames))
        w.policy.set_weights(0, weights())
        node_loop(w, args.frames)  # warm up: first resets
        g, s, n = [], [], []
        for _ in range(args.rounds):
            g.append(gym_loop(envs, args.frames, w.policy))
            s.append(gym_loop(envs, args.frames, w.policy, gym.vector.AutoresetMode.SAME_STEP))
            n.append(node_loop(w, args.frames))
        gm, sm, nm = statistics.median(g), statistics.median(s), statistics.median(n)
        print(f"| {envs} | {gm:,.0f} | {sm:,.0f} | {nm:,.0f} | {nm / gm:.2f} | {nm / sm:.2f} | {nm / max(gm, sm):.2f} |")
        w.close()
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
