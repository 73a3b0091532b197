"""Benchmark: the Python iterator against the Rust facade, in the same run.

    python python/collector/bench/bench_iter.py [rounds]

(a) frames/s of a Python loop over `rollout.DistributedCollector` touching every
batch (one element of `observation` and the sum of `next.reward`), against
(r) the Rust facade's loop over the same run started from this process, with
batches recycled (its best), and (r0) without recycling (as Python: every batch
new memory). (w) seconds per `update_policy_weights_` of a 1.0 M-parameter MLP
from NumPy, against (wr) the Rust push of the same weights. Rounds are
interleaved; medians are printed.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import rollout
from rollout import _native

RUN = dict(env="CartPole-v1", nodes=2, frames_per_batch=10_000, total_frames=-1, seed=1)
BATCHES = 300
MLP = {"kind": "mlp", "hidden": [1000, 996]}  # 4*1000 + 1000 + 1000*996 + 996 + 996*2 + 2 = 1.0 M


def python_loop() -> float:
    with rollout.DistributedCollector(**RUN) as c:
        frames, touched = 0, 0.0
        start = time.perf_counter()
        for _ in range(BATCHES):
            b = c.next()
            frames += b.numel()
            touched += float(b["observation"].flat[0]) + float(b["next", "reward"].sum())
        seconds = time.perf_counter() - start
    return frames / seconds


def rust_loop(recycle: bool) -> float:
    seconds, frames = _native.bench_rust_loop(dict(RUN), BATCHES, recycle)
    return frames / seconds


def mlp_weights() -> dict:
    rng = np.random.default_rng(0)
    shapes = {"layers.0.weight": (1000, 4), "layers.0.bias": (1000,), "layers.1.weight": (996, 1000), "layers.1.bias": (996,), "layers.2.weight": (2, 996), "layers.2.bias": (2,)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def weights_run():
    return dict(env="CartPole-v1", policy='{"kind": "mlp", "hidden": [1000, 996]}', nodes=2, frames_per_batch=100, total_frames=-1, seed=1)


def python_weights(weights: dict, rounds: int) -> float:
    settings = weights_run()
    with rollout.DistributedCollector(settings.pop("env"), MLP, **{k: v for k, v in settings.items() if k != "policy"}) as c:
        start = time.perf_counter()
        for _ in range(rounds):
            c.update_policy_weights_(weights)
        return (time.perf_counter() - start) / rounds


def main(rounds: int) -> None:
    weights = mlp_weights()
    names = [n for n in weights]
    with rollout.DistributedCollector("CartPole-v1", MLP, frames_per_batch=10, total_frames=10, seed=1) as c:
        c.update_policy_weights_(weights)  # the names and shapes fit the policy
    params = sum(w.size for w in weights.values())
    rows = {k: [] for k in ("a", "r", "r0", "w", "wr")}
    for i in range(rounds):
        rows["a"].append(python_loop())
        rows["r"].append(rust_loop(True))
        rows["r0"].append(rust_loop(False))
        rows["w"].append(python_weights(weights, 20))
        rows["wr"].append(_native.bench_rust_weights(weights_run(), weights, 20))
        print(f"round {i}: a {rows['a'][-1]/1e6:.2f} M/s  r {rows['r'][-1]/1e6:.2f} M/s  r0 {rows['r0'][-1]/1e6:.2f} M/s  "
              f"w {rows['w'][-1]*1e3:.2f} ms  wr {rows['wr'][-1]*1e3:.2f} ms", flush=True)
    m = {k: statistics.median(v) for k, v in rows.items()}
    ratios_r = statistics.median(a / r for a, r in zip(rows["a"], rows["r"]))
    ratios_r0 = statistics.median(a / r for a, r in zip(rows["a"], rows["r0"]))
    ratios_w = statistics.median(w / r for w, r in zip(rows["w"], rows["wr"]))
    print(f"median of {rounds} rounds ({params/1e6:.2f} M parameters, {len(names)} tensors):")
    print(f"| (a) Python M frames/s | (r) Rust | (r0) Rust, no recycle | a/r | a/r0 | (w) NumPy push ms | (wr) Rust push ms | w/wr |")
    print(f"| {m['a']/1e6:.2f} | {m['r']/1e6:.2f} | {m['r0']/1e6:.2f} | {ratios_r:.3f} | {ratios_r0:.3f} | {m['w']*1e3:.2f} | {m['wr']*1e3:.2f} | {ratios_w:.3f} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
