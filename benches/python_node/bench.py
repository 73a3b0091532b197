"""The Python node's collection speed against gymnasium's own vector-env loop with the same
numpy policy, in the same process and run (BENCHMARKS.md, "Python node").

    .venv/bin/python benches/python_node/bench.py [--frames N] [--rounds R]

For each env count E (1 and 8) it times, alternately, R rounds of
* `gymnasium`: SyncVectorEnv(E) of CartPole-v1, `obs = vec.reset(seed)`, then
  `a = policy.act(obs); obs, ... = vec.step(a)` for N / E steps (its default autoreset;
  the reset-only step after each episode's end is not counted as a frame);
* `node`: the node's own collection of one N-frame batch (`Workers.collect`: resets, policy,
  stepping and every batch field filled), as it answers a `continue`;
and prints the median frames/s of each and their ratio. The policy is the node's deterministic
linear policy with fixed weights, the same object in both loops.
"""

import argparse
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


def gym_loop(envs, frames, policy):
    """Frames/s of gymnasium's loop, counting real transitions only: with its default
    (next-step) autoreset, the step after an episode's end only resets and is no frame."""
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(envs)])
    obs, _ = vec.reset(seed=1)
    real = 0
    ended = np.zeros(envs, bool)
    t0 = time.perf_counter()
    for _ in range(frames // envs):
        a = policy.act(np.asarray(obs, np.float32))
        obs, _, term, trunc, _ = vec.step(a)
        real += envs - int(ended.sum())
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
    print("| envs_per_node | gymnasium loop (frames/s) | Python node (frames/s) | node / gymnasium |")
    print("|---|---|---|---|")
    for envs in (1, 8):
        w = Workers(spec(envs, args.frames))
        w.policy.set_weights(0, weights())
        node_loop(w, args.frames)  # warm up: first resets
        g, n = [], []
        for _ in range(args.rounds):
            g.append(gym_loop(envs, args.frames, w.policy))
            n.append(node_loop(w, args.frames))
        gm, nm = statistics.median(g), statistics.median(n)
        print(f"| {envs} | {gm:,.0f} | {nm:,.0f} | {nm / gm:.2f} |")
        w.close()


if __name__ == "__main__":
    main()
