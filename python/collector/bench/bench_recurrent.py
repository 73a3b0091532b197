"""Collection with a recurrent actor: frames/s of each collector, side by side.

The actor is torchrl's recurrent one (examples/ppo_lstm_torchrl.py's, on CartPole-v1's
full observation): a 64-unit ``LSTMModule`` on the observation, an MLP head,
``ProbabilisticActor(OneHotCategorical)``. Each collector runs ``--nodes`` x
``--envs-per-node`` envs (2 x 16), ``--steps`` frames of each env per batch, with its
recurrent state kept per env; frames/s are counted over at least ``--batches``
batches and ``--seconds`` seconds, the first batch (start-up) left out, nothing learnt
in between. In a fresh process each, one
after the other:

- ``rollout-rust``: ``rollout.DistributedCollector("CartPole-v1", actor,
  launcher="local")``: Rust nodes (threads of this process; CartPole-v1 is built in)
  running the actor exported to ONNX;
- ``rollout-python``: the same, on Python nodes (``python -m rollout_node``,
  ``launcher="process"``: gymnasium's CartPole-v1 stepped in Python, the ONNX actor in
  onnxruntime);
- ``torchrl``: torchrl's ``MultiSyncCollector``, one worker process per node, each a
  ``SerialEnv`` (``--torchrl-env parallel``: a ``ParallelEnv``) of ``--envs-per-node``
  ``GymEnv("CartPole-v1")`` with ``InitTracker`` and the LSTM's ``TensorDictPrimer``,
  running the actor itself.

The rollout runs are ``sync=True`` (every batch holds a share of every node, as
``MultiSyncCollector``'s do) unless ``--async``.

    python python/collector/bench/bench_recurrent.py

Figures: BENCHMARKS.md, "Recurrent policies".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

RUNS = ("rollout-rust", "rollout-python", "torchrl")
OBS_DIM = 4
HIDDEN = 64


def make_actor():
    """(actor, lstm): a 64-unit LSTM, a 64-unit tanh head, ``OneHotCategorical``."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torch import nn
    from torchrl.modules import MLP, LSTMModule, OneHotCategorical, ProbabilisticActor

    lstm = LSTMModule(input_size=OBS_DIM, hidden_size=HIDDEN, in_key="observation", out_key="embed")
    head = TensorDictModule(
        MLP(in_features=HIDDEN, out_features=2, num_cells=[64], activation_class=nn.Tanh),
        in_keys=["embed"], out_keys=["logits"],
    )
    actor = ProbabilisticActor(
        TensorDictSequential(lstm, head), in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True,
    )
    return actor, lstm


class _WorkerEnv:
    """One torchrl worker's envs: ``envs`` ``GymEnv("CartPole-v1")`` in a ``SerialEnv``
    or ``ParallelEnv``, with ``InitTracker`` and the actor's ``TensorDictPrimer``
    (picklable, for the collector's worker processes)."""

    def __init__(self, envs: int, kind: str) -> None:
        self.envs = envs
        self.kind = kind

    def __call__(self):
        from torchrl.envs import Compose, GymEnv, InitTracker, ParallelEnv, SerialEnv, TransformedEnv

        _, lstm = make_actor()
        batched = SerialEnv if self.kind == "serial" else ParallelEnv
        return TransformedEnv(
            batched(self.envs, _GymEnv()), Compose(InitTracker(), lstm.make_tensordict_primer())
        )


class _GymEnv:
    def __call__(self):
        from torchrl.envs import GymEnv

        return GymEnv("CartPole-v1")


def make_collector(run: str, actor, frames_per_batch: int, total_frames: int, args):
    if run.startswith("rollout-"):
        import rollout

        how = dict(launcher="local")
        if run == "rollout-python":
            how = dict(launcher="process", node_command=[sys.executable, "-m", "rollout_node"])
        return rollout.DistributedCollector(
            "CartPole-v1", actor, frames_per_batch=frames_per_batch, total_frames=total_frames,
            nodes=args.nodes, envs_per_node=args.envs_per_node, sync=not args.async_, seed=args.seed, **how,
        )
    if run == "torchrl":
        from torchrl.collectors import MultiSyncCollector

        return MultiSyncCollector(
            [_WorkerEnv(args.envs_per_node, args.torchrl_env)] * args.nodes, actor,
            frames_per_batch=frames_per_batch, total_frames=total_frames,
        )
    raise ValueError(f"--runs: each one of {RUNS}, got {run!r}")


def one(run: str, args) -> dict:
    """Frames/s of one collector, in this process."""
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    actor, _ = make_actor()
    frames_per_batch = args.nodes * args.envs_per_node * args.steps
    t0 = time.perf_counter()
    c = make_collector(run, actor, frames_per_batch, -1, args)
    out: dict = {"run": run}
    try:
        it = iter(c)
        first = next(it)
        out["startup_s"] = time.perf_counter() - t0
        out["batch_shape"] = list(first.shape)
        t0, frames, batches = time.perf_counter(), 0, 0
        for td in it:
            frames += td.numel()
            batches += 1
            if batches >= args.batches and time.perf_counter() - t0 >= args.seconds:
                break
        out["seconds"] = time.perf_counter() - t0
        out["batches"] = batches
        out["frames"] = frames
        out["fps"] = frames / out["seconds"]
    finally:
        c.shutdown()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--envs-per-node", type=int, default=16)
    p.add_argument("--steps", type=int, default=64, help="frames of each env per batch")
    p.add_argument("--batches", type=int, default=10, help="at least this many batches counted (after the first)")
    p.add_argument("--seconds", type=float, default=10.0, help="and at least this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1, help="rounds of all the runs, one after the other")
    p.add_argument("--async", dest="async_", action="store_true", help="rollout's runs async (default: sync)")
    p.add_argument("--torchrl-env", default="serial", choices=("serial", "parallel"), help="each torchrl worker's batched env")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args)), flush=True)
        return

    load = os.getloadavg()
    print(f"load before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    results = []
    for run in [r for _ in range(args.rounds) for r in args.runs.split(",")]:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", run, "--nodes", str(args.nodes),
               "--envs-per-node", str(args.envs_per_node), "--steps", str(args.steps),
               "--batches", str(args.batches), "--seconds", str(args.seconds), "--seed", str(args.seed), "--torchrl-env", args.torchrl_env]
        if args.async_:
            cmd.append("--async")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if proc.returncode != 0 or not lines:
            err = proc.stderr.strip().splitlines()
            print(f"{run}: failed (exit {proc.returncode}): {err[-1] if err else ''}", flush=True)
            continue
        r = json.loads(lines[-1])
        results.append(r)
        print(json.dumps(r), flush=True)
    load = os.getloadavg()
    print(f"load after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    # Each run against the mean of the torchrl runs (every round's).
    base = [r["fps"] for r in results if r["run"] == "torchrl"]
    base_fps = sum(base) / len(base) if base else None
    print("| collector | batch shape | frames/s | x torchrl MultiSyncCollector | start-up (s) |")
    print("|---|---|---|---|---|")
    for r in results:
        ratio = f"{r['fps'] / base_fps:.2f}" if base_fps else "-"
        print(f"| {r['run']} | {r['batch_shape']} | {r['fps']:,.0f} | {ratio} | {r['startup_s']:.1f} |")


if __name__ == "__main__":
    main()
