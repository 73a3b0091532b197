"""The same torchrl PPO (examples/ppo_torchrl.py) with each collector, side by side.

For each collector, in a fresh process one after the other:

- collection alone: the actor's frames/s over ``--collect-batches`` batches, the first
  batch (start-up) left out, nothing learnt in between;
- the PPO run to the task's threshold: frames and wall time to it (from the first
  batch asked for; the collector's start-up is given apart), and the share of that
  time the learner spent waiting in ``next()``.

    python python/collector/bench/bench_ppo.py --env CartPole-v1

Collectors: ``torchrl`` (torchrl's ``Collector``, one process), ``torchrl-distributed``
(torchrl's ``DistributedCollector``, ``mp`` launcher), ``rollout-local`` and
``rollout-process`` (``rollout.DistributedCollector`` with the ``local`` or ``process``
launcher; the latter needs the ``rollout`` binary: ``ROLLOUT_BIN``); the distributed
ones get ``--nodes`` nodes of ``--envs-per-node`` envs, ``torchrl`` one node's envs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

RUNS = ("torchrl", "torchrl-distributed", "rollout-local", "rollout-process")


def _collector(run: str, task, actor, frames: int, args):
    import ppo_torchrl

    kind, launcher = ("rollout", run.split("-", 1)[1]) if run.startswith("rollout-") else (run, "local")
    return ppo_torchrl.make_collector(kind, task, actor, frames, args.nodes, args.envs_per_node, args.seed, launcher)


def one(run: str, args) -> dict:
    """Both measurements of one collector, in this process."""
    import torch

    import ppo_torchrl

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    task = ppo_torchrl.TASKS[args.env]
    if args.epochs is not None:
        task = dataclasses.replace(task, epochs=args.epochs)
    out: dict = {"run": run, "epochs": task.epochs}

    torch.manual_seed(args.seed)
    actor, _ = ppo_torchrl.make_actor_critic(task)
    c = _collector(run, task, actor, (args.collect_batches + 1) * task.frames_per_batch, args)
    try:
        it = iter(c)
        next(it)
        t0, frames = time.perf_counter(), 0
        for td in it:
            frames += td.numel()
        out["collect_fps"] = frames / (time.perf_counter() - t0)
    finally:
        c.shutdown()

    # torchrl's SerialEnv, when it closes, raises torch's thread count (to 2 here):
    # the learner runs on one thread in every run, as the example's does.
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    actor, critic = ppo_torchrl.make_actor_critic(task)
    t0 = time.perf_counter()
    c = _collector(run, task, actor, args.frames, args)
    out["startup_s"] = time.perf_counter() - t0
    try:
        h = ppo_torchrl.train(task, c, actor, critic, args.frames, stop_at_threshold=True)
    finally:
        c.shutdown()
    out["solved_frames"] = h.solved_at
    out["solved_s"] = h.solved_wall
    out["waiting"] = (h.solved_waited / h.solved_wall) if h.solved_wall else (h.waited[-1] / h.wall[-1] if h.wall else None)
    out["frames"] = h.frames[-1] if h.frames else 0
    # The learner's own seconds per batch: what the machine's load does to every run alike.
    n = len(h.frames)
    out["learner_s_per_batch"] = (h.wall[-1] - h.waited[-1]) / n if n else None
    out["best_return"] = h.best
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--envs-per-node", type=int, default=4)
    p.add_argument("--frames", type=int, default=None, help="frame budget of the PPO run (default: 300k CartPole, 1M Pendulum)")
    p.add_argument("--collect-batches", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1, help="rounds of all the runs, one after the other")
    p.add_argument("--epochs", type=int, default=None, help="optimisation epochs per batch (default: the task's, 10)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.frames is None:
        args.frames = 300_000 if args.env == "CartPole-v1" else 1_000_000
    if args.one:
        print(json.dumps(one(args.one, args)), flush=True)
        return

    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    results = []
    for run in [r for _ in range(args.rounds) for r in args.runs.split(",")]:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", run, "--env", args.env, "--nodes", str(args.nodes),
               "--envs-per-node", str(args.envs_per_node), "--frames", str(args.frames),
               "--collect-batches", str(args.collect_batches), "--seed", str(args.seed)]
        if args.epochs is not None:
            cmd += ["--epochs", str(args.epochs)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if proc.returncode != 0 or not lines:
            err = proc.stderr.strip().splitlines()
            print(f"{run}: failed (exit {proc.returncode}): {err[-1] if err else ''}", flush=True)
            continue
        r = json.loads(lines[-1])
        results.append(r)
        print(json.dumps(r), flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print("| collector | collection frames/s | frames to threshold | wall to threshold (s) | waiting | x torchrl Collector (same round) | learner s per batch | start-up (s) |")
    print("|---|---|---|---|---|---|---|---|")
    base = None
    for r in results:
        if r["run"] == "torchrl":
            base = r if r.get("solved_s") else None
        solved = r.get("solved_s")
        ratio = f"{solved / base['solved_s']:.2f}" if solved and base else "-"
        per_batch = r.get("learner_s_per_batch")
        per_batch = f"{per_batch:.2f}" if per_batch is not None else "-"
        waiting = f"{100 * r['waiting']:.1f} %" if r.get("waiting") is not None else "-"
        print(
            f"| {r['run']} | {r['collect_fps']:,.0f} | {r['solved_frames'] or 'not reached in ' + str(r['frames'])} | "
            f"{solved:.1f} | {waiting} | {ratio} | {per_batch} | {r['startup_s']:.1f} |"
            if solved else
            f"| {r['run']} | {r['collect_fps']:,.0f} | not reached in {r['frames']} (best {r['best_return']:.1f}) | - | {waiting} | - | {per_batch} | {r['startup_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
