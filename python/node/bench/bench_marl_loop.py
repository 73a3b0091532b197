"""The Python node's multi-agent loop against PettingZoo's own, in one process (issue 40).

Three figures of CPU time a frame (one step of one env, every agent), alternating round by
round over the same number of envs:

- ``own``: the ParallelEnvs stepped in a plain loop with actions drawn beforehand, reset when
  no agent is left (the env's own cost, as bench_marl.py's limit steps it);
- ``node``: ``PettingZooWorkers.collect`` of the same envs, the ``random`` policy, every batch
  field written (``own / node`` is the node's loop as a share of the env's own);
- ``step`` (with ``--time-step``): the mean wall time of one ``env.step`` call inside the
  node's loop and inside the own loop (whether the env steps slower around the node's work);
- ``overhead`` (with ``--overhead``): the node's loop with every env's ``step`` replaced by its
  last result: the node's own Python a frame, the env taking no time.

    PYTHONPATH=python/node .venv/bin/python python/node/bench/bench_marl_loop.py --envs 16 --rounds 3

Figures: BENCHMARKS.md, "Multi-agent collection".
"""

import argparse
import importlib
import time

import numpy as np

from rollout_node.envpool_backend import make_workers


def spec(env, config, envs, steps):
    """A NodeSpec of node 0 (PROTOCOL.md §3), the random policy."""
    return {
        "index": 0, "env": {"name": env, "config": config},
        "policy": {"config": {"kind": "random"}, "exploration": "random", "init_seed": 0},
        "envs_per_node": envs, "first_lane": 0, "lanes": envs,
        "rollout": {"frames_per_batch": steps, "max_frames_per_traj": None, "reset_at_each_iter": False,
                    "init_random_frames": 0, "seed": 0, "nan_is_failure": False},
    }


def cpu_per_frame(run, seconds):
    """CPU µs a frame of ``run()`` (which returns the frames it made) over ``seconds``."""
    n, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        n += run()
    return (time.process_time() - t0) / n * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--env", default="pettingzoo:mpe2.simple_spread_v3")
    p.add_argument("--config", default='{"N": 3, "max_cycles": 25}', help="the env's keyword arguments, JSON")
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=64, help="steps of each env a batch")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--time-step", action="store_true")
    p.add_argument("--overhead", action="store_true")
    args = p.parse_args()
    import json

    config = json.loads(args.config)
    E, T = args.envs, args.steps
    w = make_workers(spec(args.env, config, E, T))
    w.collect(E * T)
    make = importlib.import_module(args.env.split(":")[1]).parallel_env
    envs = [make(**config) for _ in range(E)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    agents = list(envs[0].possible_agents)
    n = [envs[0].action_space(a).n for a in agents]
    acts = np.random.default_rng(0).integers(0, n, size=(4096, len(agents))).tolist()
    j = [0]

    def own():
        for e in envs:
            e.step(dict(zip(agents, acts[j[0] % 4096])))
            j[0] += 1
            if not e.agents:
                e.reset()
        return E

    def node():
        w.collect(E * T)
        return E * T

    for r in range(args.rounds):
        a, b = cpu_per_frame(own, args.seconds), cpu_per_frame(node, args.seconds)
        print(f"round {r}: own {a:.1f} µs a frame, node {b:.1f}, own / node {a / b:.3f}")
    if args.time_step:
        spent = [0.0, 0]

        def timed(step):
            def run(actions):
                t = time.perf_counter()
                r = step(actions)
                spent[0] += time.perf_counter() - t
                spent[1] += 1
                return r

            return run

        for group in (w.vec.envs, envs):
            for e in group:
                e.step = timed(e.step)
        for r in range(args.rounds):
            for name, run in (("own", own), ("node", node)):
                spent[:] = [0.0, 0]
                cpu_per_frame(run, args.seconds)
                print(f"round {r}: env.step inside the {name} loop {spent[0] / spent[1] * 1e6:.1f} µs")
    if args.overhead:
        for e in w.vec.envs:
            last = e.step({a: 0 for a in e.agents})
            e.step = (lambda r: (lambda actions: r))(last)
        for r in range(args.rounds):
            print(f"round {r}: the node's own Python {cpu_per_frame(node, args.seconds):.1f} µs a frame")


if __name__ == "__main__":
    main()
