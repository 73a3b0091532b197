"""Multi-agent collection benchmark (issue 40 item 7): agent-steps/s of each collector on a
PettingZoo env and torchrl's multi-agent actor, against the machine's limit for that env and
actor, measured in the same run.

Workloads (``--workload``):

- ``simple_spread``: ``mpe2.simple_spread_v3.parallel_env(N=3, max_cycles=25)`` (discrete
  actions, 3 agents of group ``agent``, observation f32 ``[18]`` each), the actor
  ``ProbabilisticActor(Categorical)`` over ``MultiAgentMLP(n_agent_inputs=18,
  n_agent_outputs=5, n_agents=3, centralised=False, share_params=True, depth=2,
  num_cells=64)`` reading ``("agent", "observation")`` (torchrl's multi-agent actor, as its
  multi-agent tutorials build it, ``return_log_prob=True``);
- ``pistonball``: ``pettingzoo.butterfly.pistonball_v6.parallel_env(continuous=False)``
  (20 agents of group ``piston``, uint8 ``[457, 120, 3]`` images each, 3 actions,
  max_cycles 125). ``MultiAgentMLP`` on the flattened image (164,520 inputs x 64 cells, 10.5 M
  weights, 3.4 GFLOP a forward of 8 envs) is not an actor anyone runs on images: the
  actor is a small shared CNN per agent (uint8 scaled by 1/255, conv 3->8 8x8 stride 8,
  ReLU, flattened: 6,840 features) under the same ``MultiAgentMLP(share_params=True,
  centralised=False, depth=2, num_cells=64)`` and ``Categorical``.

A frame is one env step of every agent; agent-steps = frames x agents. Every collector runs
the same actor on ``--nodes`` x ``--envs-per-node`` envs (2 x K), ``--steps`` steps of each
env per batch (defaults: simple_spread 16 and 64, since 16 envs a node amortise the policy
call, 0.88-0.90 of the limit against 0.84-0.86 at 8, BENCHMARKS.md; pistonball 1 and 16);
frames are counted over at least ``--seconds`` seconds of batches after the first one
(start-up). Each run is a fresh process, one after the other (``--runs``,
``--rounds`` times):

- ``limit``: what the machine can do if nothing but the env and the actor ran (as
  ``bench_workloads.py``). (E) the env's own loop alone (the ParallelEnv stepped with
  random actions drawn beforehand, one per agent, reset when ``env.agents`` empties) in one
  process per core, all at once: env steps/s summed over the cores; (F) the actor's forward
  alone at the batch size rollout's nodes use (K envs a call), one process per core, all at
  once, summed: torch (the ``ProbabilisticActor`` on a TensorDict, sampling, ``no_grad``),
  and the ONNX model rollout exports in onnxruntime unoptimised (``ORT_DISABLE_ALL``, 1
  thread; named ``ort-node`` after what the node ran before 2026-12-06) and fully optimised
  (``ORT_ENABLE_ALL``, as the Python node runs it now); the fastest is
  F (per CPU-second). ``L = 1 / (1/E + 1/F)`` frames/s. Measured at the start of each round
  and once after the last; the ratios are to the mean.
- ``rollout``: ``rollout.DistributedCollector(PettingZooWrapper(env), actor, nodes=2,
  envs_per_node=K)``, the default launcher: the collector starts Python nodes
  (``python -m rollout_node``; its PettingZoo backend, the actor exported to ONNX and run
  in onnxruntime), async unless ``--sync``.
- ``torchrl-collector``: torchrl's ``Collector(PettingZooWrapper(env), actor)`` in this
  one process (one env, the actor at batch 1, as torchrl's multi-agent examples run it
  without vectorising; ``--torchrl-envs serial`` makes it a ``SerialEnv`` of the 2K envs).
- ``torchrl-multisync``: torchrl's ``MultiSyncCollector``, one worker process per node
  (``--nodes``), each a ``SerialEnv`` of K ``PettingZooWrapper`` envs running the actor.

Each run also counts CPU time: every process of the run (this one and its descendants: the
nodes, torchrl's workers) over the window, and each limit worker's own; frames per
CPU-second compare on a machine whose load changes, the wall rates do not.

Every torchrl env is ``PettingZooWrapper(env, done_on_any=False)``: rollout's nodes end
an episode once every agent is done (with agents that end together, as here, the same
episodes as torchrl's default). ``auto_register_policy_transforms=False`` keeps torchrl's
keys as they are (no ``InitTracker``).

Run with this worktree's node on ``PYTHONPATH`` (the nodes the collector starts inherit it):

    PYTHONPATH=python/node python python/collector/bench/bench_marl.py --workload simple_spread --rounds 3

Figures: BENCHMARKS.md, "Multi-agent collection (PettingZoo)".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from typing import Any, Dict, Tuple

import torch
from torch import nn

RUNS = ("limit", "rollout", "torchrl-collector", "torchrl-multisync")

# The nodes the collector starts inherit PYTHONPATH (and may run elsewhere): absolute paths.
if os.environ.get("PYTHONPATH"):
    os.environ["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p)


@dataclasses.dataclass(frozen=True)
class Workload:
    module: str  # the PettingZoo module whose parallel_env(**config) every collector makes
    config: Dict[str, Any]
    group: str
    n_agents: int
    obs_shape: Tuple[int, ...]
    obs_dtype: str
    n_actions: int
    envs_per_node: int  # K, the default
    steps: int  # T, the default

    def make(self):
        import importlib

        return importlib.import_module(self.module).parallel_env(**self.config)

    def actor(self):
        return marl_actor(self)


WORKLOADS: Dict[str, Workload] = {
    "simple_spread": Workload("mpe2.simple_spread_v3", {"N": 3, "max_cycles": 25}, "agent", 3, (18,), "float32", 5, 16, 64),
    "pistonball": Workload("pettingzoo.butterfly.pistonball_v6", {"continuous": False}, "piston", 20, (457, 120, 3),
                           "uint8", 3, 1, 16),
}


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# -- the actor ------------------------------------------------------------------------------


class AgentCNN(nn.Module):
    """uint8 images ``[..., n, H, W, 3]`` to ``[..., n, features]``: one conv shared by the
    agents (8 channels, 8x8, stride 8), ReLU, flattened."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 8, stride=8)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        lead = obs.shape[:-3]
        x = obs.reshape(-1, *obs.shape[-3:]).to(torch.float32) / 255.0
        x = torch.relu(self.conv(x.permute(0, 3, 1, 2)))
        return x.reshape(*lead, -1)


def marl_actor(w: Workload):
    """torchrl's multi-agent actor: ``ProbabilisticActor(Categorical)`` over a
    ``MultiAgentMLP`` (a small CNN first on images), reading ``(group, "observation")``."""
    import torch
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.data import Categorical as CategoricalSpec
    from torchrl.modules import MultiAgentMLP, ProbabilisticActor

    g = w.group
    if len(w.obs_shape) == 1:
        feats, pre = w.obs_shape[0], []
    else:
        cnn = AgentCNN()
        with torch.no_grad():
            feats = cnn(torch.zeros(1, 1, *w.obs_shape, dtype=torch.uint8)).shape[-1]
        pre = [cnn]
    mlp = MultiAgentMLP(n_agent_inputs=feats, n_agent_outputs=w.n_actions, n_agents=w.n_agents,
                        centralised=False, share_params=True, depth=2, num_cells=64)
    net = nn.Sequential(*pre, mlp)
    module = TensorDictModule(net, in_keys=[(g, "observation")], out_keys=[(g, "logits")])
    return ProbabilisticActor(
        module, in_keys=[(g, "logits")], out_keys=[(g, "action")], distribution_class=torch.distributions.Categorical,
        return_log_prob=True, spec=CategoricalSpec(w.n_actions, shape=(w.n_agents,)),
    )


# -- the limit ------------------------------------------------------------------------------


def _env_worker(workload: str, seed: int, seconds: float, barrier, out) -> None:
    import numpy as np

    warnings.filterwarnings("ignore")
    w = WORKLOADS[workload]
    env = w.make()
    env.reset(seed=seed)
    agents = list(env.possible_agents)
    rng = np.random.default_rng(seed)
    # Random actions drawn beforehand, one per agent, as the env takes them (Python ints).
    actions = [dict(zip(agents, row)) for row in rng.integers(0, w.n_actions, (1000, len(agents))).tolist()]
    for i in range(20):  # warm up
        env.step(actions[i])
        if not env.agents:
            env.reset()
    barrier.wait()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        for _ in range(10):
            env.step(actions[n % 1000])
            n += 1
            if not env.agents:
                env.reset()
        t = time.perf_counter() - t0
        if t >= seconds:
            break
    out.put((n / t, n / (time.process_time() - c0)))


def _onnx_model(w: Workload, actor) -> bytes:
    """The ONNX model ``rollout.DistributedCollector`` exports for this actor (the module's
    own exporter, on the env's spaces as the nodes give them)."""
    from rollout import _collector, _torch

    return _torch.export_policy(actor, _collector._env_specs("pettingzoo:" + w.module, w.config, None)).model


def _forward_worker(workload: str, how: str, batch: int, seconds: float, barrier, out) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    w = WORKLOADS[workload]
    torch.manual_seed(0)
    actor = w.actor()
    rng = np.random.default_rng(0)
    shape = (batch, w.n_agents, *w.obs_shape)
    if w.obs_dtype == "uint8":
        obs = rng.integers(0, 255, shape, dtype=np.uint8)
    else:
        obs = rng.standard_normal(shape).astype(np.float32)
    if how == "torch":
        from tensordict import TensorDict
        from torchrl.envs.utils import ExplorationType, set_exploration_type

        x = torch.from_numpy(obs)

        def call():
            with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
                actor(TensorDict({(w.group, "observation"): x}, [batch]))
    else:
        import onnxruntime as ort

        model = _onnx_model(w, actor)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_DISABLE_ALL if how == "ort-node" else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        )
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: obs}

        def call():
            sess.run(None, feed)

    for _ in range(3):
        call()
    barrier.wait()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        call()
        n += batch
        t = time.perf_counter() - t0
        if t >= seconds:
            break
    out.put((n / t, n / (time.process_time() - c0)))


def _all_cores(target, args_of, seconds: float, cores: int):
    """``target`` in one spawned process per core at once (released together by a barrier):
    the sum of the rates each put, and the mean of their rates per CPU-second."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(cores), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(i), seconds, barrier, out)) for i in range(cores)]
    for p in procs:
        p.start()
    rates = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    return sum(r for r, _ in rates), sum(c for _, c in rates) / len(rates)


def limit(args) -> dict:
    cores = _cores()
    k = args.envs_per_node
    out: dict = {"run": "limit", "cores": cores, "batch": k}
    out["env_all"], out["env_per_cpu_s"] = _all_cores(_env_worker, lambda i: (args.workload, args.seed + i), args.seconds, cores)
    fwd, fwd_cpu = {}, {}
    for how in ("torch", "ort-node", "ort-opt"):
        try:
            fwd[how], fwd_cpu[how] = _all_cores(_forward_worker, lambda i: (args.workload, how, k), args.seconds, cores)
        except Exception as e:
            out[f"forward_{how}_error"] = repr(e)
    out.update({f"forward_{h}_all": v for h, v in fwd.items()})
    out.update({f"forward_{h}_per_cpu_s": v for h, v in fwd_cpu.items()})
    best = max(fwd_cpu, key=fwd_cpu.get)
    out["forward_best"] = best
    e, f = out["env_all"], fwd[best]
    out["fps"] = 1.0 / (1.0 / e + 1.0 / f)
    out["env_per_core"], out["forward_per_core"] = e / cores, f / cores
    # Per CPU-second: what one core does when it has the env and the actor to itself.
    out["fps_per_cpu_s"] = 1.0 / (1.0 / out["env_per_cpu_s"] + 1.0 / fwd_cpu[best])
    return out


def _tree_cpu() -> float:
    """CPU seconds (user + system) of this process and every live descendant."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            stats[int(pid)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, ValueError, IndexError):
            continue
    mine, total, grew = {os.getpid()}, 0.0, True
    while grew:
        grew = False
        for pid, (ppid, _) in stats.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    for pid in mine:
        total += stats.get(pid, (0, 0.0))[1]
    return total


# -- collectors -----------------------------------------------------------------------------


class _TorchrlEnv:
    """One ``PettingZooWrapper`` of the workload, picklable (for torchrl's workers)."""

    def __init__(self, workload: str, seed: int = 0) -> None:
        self.workload, self.seed = workload, seed

    def __call__(self):
        from torchrl.envs import PettingZooWrapper

        warnings.filterwarnings("ignore")
        return PettingZooWrapper(env=WORKLOADS[self.workload].make(), done_on_any=False, seed=self.seed)


class _TorchrlEnvs:
    """``n`` of them in a ``SerialEnv``, picklable."""

    def __init__(self, workload: str, n: int, seed: int) -> None:
        self.workload, self.n, self.seed = workload, n, seed

    def __call__(self):
        from torchrl.envs import SerialEnv

        return SerialEnv(self.n, [_TorchrlEnv(self.workload, self.seed + i) for i in range(self.n)])


def make_collector(run: str, w: Workload, actor, frames_per_batch: int, args):
    k, nodes = args.envs_per_node, args.nodes
    if run == "rollout":
        import rollout

        return rollout.DistributedCollector(
            _TorchrlEnv(args.workload, args.seed)(), actor, frames_per_batch=frames_per_batch, total_frames=-1,
            nodes=nodes, envs_per_node=k, sync=args.sync, seed=args.seed,
        )
    if run == "torchrl-collector":
        from torchrl.collectors import Collector

        if args.torchrl_envs == "serial":
            env = _TorchrlEnvs(args.workload, nodes * k, args.seed)()
        else:
            env = _TorchrlEnv(args.workload, args.seed)()
        return Collector(env, actor, frames_per_batch=frames_per_batch, total_frames=-1,
                         auto_register_policy_transforms=False)
    if run == "torchrl-multisync":
        from torchrl.collectors import MultiSyncCollector

        return MultiSyncCollector(
            [_TorchrlEnvs(args.workload, k, args.seed + i * k) for i in range(nodes)], actor,
            frames_per_batch=frames_per_batch, total_frames=-1, auto_register_policy_transforms=False,
        )
    raise ValueError(run)


def collector_run(run: str, args) -> dict:
    import torch

    w = WORKLOADS[args.workload]
    actor = w.actor()
    frames_per_batch = args.nodes * args.envs_per_node * args.steps
    t0 = time.perf_counter()
    c = make_collector(run, w, actor, frames_per_batch, args)
    out: dict = {"run": run}
    try:
        it = iter(c)
        first = next(it)
        out["startup_s"] = time.perf_counter() - t0
        out["batch_shape"] = list(first.shape)
        out["keys"] = len(list(first.keys(True, True)))
        del first
        t0, cpu0, tree0, frames, batches = time.perf_counter(), time.process_time(), _tree_cpu(), 0, 0
        for td in it:
            frames += td.numel()
            batches += 1
            if time.perf_counter() - t0 >= args.seconds:
                break
        out["seconds"] = time.perf_counter() - t0
        # This process's CPU over the window: the trainer's share for rollout (receiving and
        # decoding batches), everything for torchrl's Collector.
        out["this_process_cpu_s"] = time.process_time() - cpu0
        # Every process of the collector (this one, its nodes or workers): frames per
        # CPU-second, the figure a loaded machine leaves comparable.
        out["tree_cpu_s"] = _tree_cpu() - tree0
        out["batches"], out["frames"] = batches, frames
        out["fps"] = frames / out["seconds"]
        out["fps_per_cpu_s"] = frames / out["tree_cpu_s"] if out["tree_cpu_s"] > 0 else None
        if run == "rollout":
            out["node_package"] = _node_package()
            out["stats"] = {k: v for k, v in c.stats().items() if isinstance(v, (int, float))}
    finally:
        c.shutdown()
    torch.set_num_threads(1)
    return out


def _node_package() -> list:
    """Where the running nodes (``-m rollout_node``, children of this process) import
    ``rollout_node`` from: their interpreter, environment and directory asked."""
    found = set()
    me = str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if ppid != me or b"rollout_node" not in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.decode().split("=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            cwd = os.readlink(f"/proc/{pid}/cwd")
            r = subprocess.run([cmd[0].decode(), "-c", "import rollout_node; print(rollout_node.__file__)"],
                               env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
            found.add(r.stdout.strip())
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            continue
    return sorted(found)


def one(run: str, args) -> dict:
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    if run == "limit":
        return limit(args)
    return collector_run(run, args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    p.add_argument("--seconds", type=float, default=12.0, help="seconds each measurement counts (after start-up)")
    p.add_argument("--nodes", type=int, default=None, help="nodes / worker processes (default: the cores)")
    p.add_argument("--envs-per-node", type=int, default=None, help="K (default: the workload's)")
    p.add_argument("--steps", type=int, default=None, help="T, steps of each env per batch (default: the workload's)")
    p.add_argument("--sync", action="store_true", help="rollout sync (default: async)")
    p.add_argument("--torchrl-envs", default="single", choices=("single", "serial"),
                   help="torchrl Collector's env: one PettingZooWrapper (single) or a SerialEnv of the 2K (serial)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--limit-once", action="store_true", help="measure the limit once, not before and after the runs")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    w = WORKLOADS[args.workload]
    args.nodes = args.nodes or _cores()
    args.envs_per_node = args.envs_per_node or w.envs_per_node
    args.steps = args.steps or w.steps
    if args.one:
        print(json.dumps(one(args.one, args)), flush=True)
        return

    load = os.getloadavg()
    print(f"workload {args.workload}: {w.module} {w.config}, {w.n_agents} agents, {args.nodes} x {args.envs_per_node} envs, "
          f"{args.steps} steps per env per batch, {_cores()} cores; load before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
          flush=True)
    results = []
    runs = [r for _ in range(args.rounds) for r in args.runs.split(",")]
    if "limit" in runs and runs[-1] != "limit" and not args.limit_once:
        runs.append("limit")
    for run in runs:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", run] + sys.argv[1:]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=2 * args.seconds + 240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            stderr += "\ntimed out (the run's process group was killed)"
        lines = [l for l in stdout.splitlines() if l.startswith("{")]
        if proc.returncode != 0 or not lines:
            err = [l for l in stderr.strip().splitlines() if l.strip()]
            print(f"{run}: failed (exit {proc.returncode}): {err[-1] if err else ''}", flush=True)
            if os.environ.get("BENCH_VERBOSE"):
                print(stderr[-4000:], flush=True)
            continue
        r = json.loads(lines[-1])
        r["load1"] = os.getloadavg()[0]
        results.append(r)
        print(json.dumps(r), flush=True)
    load = os.getloadavg()
    print(f"load after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    n = w.n_agents
    lim = [r for r in results if r["run"] == "limit"]
    lim_fps = sum(r["fps"] for r in lim) / len(lim) if lim else None
    lim_cpu = sum(r["fps_per_cpu_s"] for r in lim) / len(lim) if lim else None
    if len(lim) > 1:
        print(f"limit: {len(lim)} measurements, {min(r['fps'] for r in lim) * n:,.0f} to {max(r['fps'] for r in lim) * n:,.0f} "
              f"agent-steps/s ({min(r['fps_per_cpu_s'] for r in lim) * n:,.0f} to {max(r['fps_per_cpu_s'] for r in lim) * n:,.0f} "
              f"per CPU-second); ratios are to their means {lim_fps * n:,.0f} and {lim_cpu * n:,.0f}")
    for r in lim:
        print(f"limit: env alone {r['env_all'] * n:,.0f} agent-steps/s on {r['cores']} cores ({r['env_per_cpu_s'] * n:,.0f} per "
              f"CPU-second); forward alone at batch {r['batch']} envs: " + ", ".join(
                  f"{h} {r[f'forward_{h}_all'] * n:,.0f} ({r[f'forward_{h}_per_cpu_s'] * n:,.0f} per CPU-s)"
                  for h in ("torch", "ort-node", "ort-opt") if f"forward_{h}_all" in r)
              + f" agent-steps/s; L = 1/(1/E + 1/F[{r['forward_best']}]) = {r['fps'] * n:,.0f} agent-steps/s, "
              f"{r['fps_per_cpu_s'] * n:,.0f} per CPU-second")
    print("| run | batch shape | agent-steps/s | x limit | agent-steps per CPU-second | x limit | CPU used (cores) | load | start-up (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        cpu = r.get("fps_per_cpu_s") or r.get("fps_per_cpu_s")
        ratio = f"{r['fps'] / lim_fps:.2f}" if lim_fps else "-"
        rc = f"{cpu / lim_cpu:.2f}" if lim_cpu and cpu else "-"
        used = f"{r['tree_cpu_s'] / r['seconds']:.2f}" if "tree_cpu_s" in r else "-"
        print(f"| {r['run']} | {r.get('batch_shape', '-')} | {r['fps'] * n:,.0f} | {ratio} | "
              f"{cpu * n if cpu else 0:,.0f} | {rc} | {used} | {r['load1']:.1f} | {r.get('startup_s', 0):.1f} |")
    by = {}
    for r in results:
        by.setdefault(r["run"], []).append(r)
    print("summary, min..max over runs (x the limits' mean):")
    for run, rs in by.items():
        v = [r["fps"] * n for r in rs]
        c = [r["fps_per_cpu_s"] * n for r in rs if r.get("fps_per_cpu_s")]
        line = f"  {run} ({len(rs)} runs): {min(v):,.0f}..{max(v):,.0f} agent-steps/s"
        if lim_fps:
            line += f" = {min(v) / (lim_fps * n):.2f}..{max(v) / (lim_fps * n):.2f} x L"
        if c:
            line += f"; {min(c):,.0f}..{max(c):,.0f} per CPU-second"
            if lim_cpu:
                line += f" = {min(c) / (lim_cpu * n):.2f}..{max(c) / (lim_cpu * n):.2f} x L per CPU-second"
        print(line)

if __name__ == "__main__":
    main()
