"""Workload benchmarks (issue 43): frames/s of each collector on a real env and actor,
against the machine's limit for that env and actor, measured in the same run.

Workloads (``--workload``):

- ``pong-raw``: ALE/Pong-v5 (raw uint8 ``[210, 160, 3]`` frames, v5's frame skip 4 and
  sticky actions), a Nature-CNN ``ProbabilisticActor(OneHotCategorical)`` reading the raw
  frame (workloads/actors.py);
- ``pong84``: ``RolloutBench/Pong84-v5`` (workloads/atari_envs.py: ALE/Pong-v5 under
  gymnasium's ``AtariPreprocessing`` and a ``FrameStackObservation`` of 4, uint8
  ``[4, 84, 84]``), the same Nature-CNN on it;
- ``halfcheetah``: HalfCheetah-v5 (f64 ``[17]``, 6 actions in [-1, 1]), a 256-256 ReLU
  ``ProbabilisticActor(TanhNormal)``.

A frame is one env step (4 emulator frames on Pong). Every collector runs the same actor
on ``--nodes`` x ``--envs-per-node`` envs (2 x K), ``--steps`` steps of each env per
batch; frames/s are counted over at least ``--seconds`` seconds of batches after the
first one (start-up). Each run is a fresh process, one after the other (``--runs``;
``--rounds`` R repeats them, each round starting the peers one further along):

- ``limit``: what the machine can do if nothing but the env and the actor ran. (E) the
  env's own stepping alone (``gymnasium.make``, random actions drawn beforehand, reset on
  done) in one process per core, all at once: env steps/s summed over the cores; (F) the actor's
  forward alone at the batch size rollout's nodes use (K rows a call), one process per
  core, all at once, summed: torch (the ``ProbabilisticActor`` on a TensorDict, sampling,
  ``no_grad``), and the ONNX model rollout exports in onnxruntime unoptimised
  (``ORT_DISABLE_ALL``, 1 thread; ``ort-node``, what the node ran before 2026-12-06) and
  fully optimised (``ORT_ENABLE_ALL``, 1 thread, as the Python node runs it now);
  the fastest of the three is F. Every frame costs one env step and one K-th of a forward,
  on the same cores, so the limit is ``L = 1 / (1/E + 1/F)`` frames/s (per core the same:
  ``1 / (1/e + 1/f)`` with e = E / cores, f = F / cores, times the cores). It is measured
  before the other runs and again after them (``--limit-once``: before only); the ratios
  are to the mean.
- ``rollout``: ``rollout.DistributedCollector(env_id, actor, nodes=2, envs_per_node=K,
  launcher="process", node_command=[python, -m, rollout_node, --import,
  workloads.atari_envs])``: Python nodes (gymnasium's envs, the ONNX actor in
  onnxruntime), async unless ``--sync``. Rust nodes cannot serve these envs (their
  built-in envs are CartPole-v1, Pendulum-v1, MountainCarContinuous-v0, Counting).
- ``torchrl-collector``: torchrl's ``Collector`` (the actor in this process) over a
  ``ParallelEnv`` of the 2K ``GymEnv`` (ALE/Pong-v5 as ``GymEnv(id, frame_skip=4)``, since
  torchrl makes an ALE env with ``frameskip=1`` otherwise, its ``pixels`` renamed
  ``observation``) (``--torchrl-env nested``: a ``ParallelEnv`` of
  ``--nodes`` workers, each a ``SerialEnv`` of K);
- ``torchrl-multisync``: torchrl's ``MultiSyncCollector``, one worker process per node
  (``--nodes``, one per core), each a ``SerialEnv`` of K ``GymEnv`` running the actor;
- ``gym-async``: gymnasium's ``AsyncVectorEnv`` of the 2K envs (one process each,
  shared memory, same-step autoreset) and a torch loop in this process: the actor on the
  2K observations, the step, the frame written into preallocated ``[T, 2K, ...]`` batch
  tensors (observation, action, log-prob, reward, done);
- ``envpool``: EnvPool's ``Pong-v5`` (raw: 210x160 RGB, no stacking, or 84x84 gray x 4)
  or ``HalfCheetah-v4`` (EnvPool has no v5), 2K envs, ``num_threads`` = cores, and the
  same torch loop; skipped when ``import envpool`` fails;
- ``sample-factory``: Sample Factory 2.1.1's own sampler, no learner (workloads/sf_peer.py:
  ``SyncSamplingAPI``, ``--nodes`` rollout workers of K envs, its inference workers, CPU).
  It pins gymnasium < 1.0 and numpy < 2.0, so it runs in a venv of its own:
  ``--sf-python`` (default: ``.venv-sf/bin/python`` of the checkout, which
  ``scripts/sf-venv.sh`` makes); skipped, saying so, when there is none. Its envs are
  gymnasium 0.29's (HalfCheetah-v4, no v5 there) and its actor its own (the same layers;
  a plain Normal head on HalfCheetah, a value head beside): see sf_peer.py.

``--nodes`` defaults to the cores (2 here); K and T default to the workload's (pong-raw 4
and 32, pong84 8 and 64, halfcheetah 16 and 128: at 8 the model's and the sampling's
per-call costs were a quarter of what a node adds, see BENCHMARKS.md). ``--profile-nodes
PREFIX`` runs rollout's nodes under cProfile (workloads/profiled_node.py: ``PREFIX.<pid>.prof`` and the node's wall
and CPU times in ``PREFIX.<pid>.json``). pong84 needs OpenCV (gymnasium's
``AtariPreprocessing`` resizes with it: ``pip install opencv-python-headless``).

torchrl's envs for HalfCheetah carry ``DoubleToFloat`` (the float32 actor on float64
observations), as torchrl's MuJoCo examples do; rollout's nodes cast the observation for
the ONNX input themselves (the batch keeps float64), gymnasium's and EnvPool's loops
cast in the loop.

    PYTHONPATH=python/collector:python/node python python/collector/bench/bench_workloads.py --workload pong84

Figures: BENCHMARKS.md, "Workloads (Pong + CNN, HalfCheetah + MLP)".
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
from typing import Any, Dict, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
# The nodes and torchrl's worker processes import workloads.* too.
_pp = os.environ.get("PYTHONPATH", "")
if HERE not in _pp.split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE] + ([_pp] if _pp else []))

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
RUNS = ("limit", "rollout", "torchrl-collector", "torchrl-multisync", "gym-async", "envpool", "sample-factory")
PEERS = RUNS[1:]


@dataclasses.dataclass(frozen=True)
class Workload:
    env: str  # the gymnasium id every collector makes
    obs_shape: Tuple[int, ...]
    image: bool  # uint8 frames (the CNN) or a float vector (the MLP)
    n_actions: int  # discrete actions, or the action's dimension
    continuous: bool
    envpool_task: str
    envpool_kwargs: Dict[str, Any]
    envs_per_node: int  # K, the default
    steps: int  # T, the default: steps of each env per batch

    def actor(self):
        from workloads.actors import gaussian_actor, nature_cnn_actor

        if self.continuous:
            return gaussian_actor(self.obs_shape[0], self.n_actions, -1.0, 1.0)
        return nature_cnn_actor(self.obs_shape, self.n_actions, channels_last=self.obs_shape[-1] == 3)


_ATARI_ENVPOOL = dict(episodic_life=False, reward_clip=False, repeat_action_probability=0.25, frame_skip=4)
WORKLOADS: Dict[str, Workload] = {
    "pong-raw": Workload(
        "ALE/Pong-v5", (210, 160, 3), True, 6, False, "Pong-v5",
        dict(_ATARI_ENVPOOL, img_height=210, img_width=160, gray_scale=False, stack_num=1, noop_max=1), 4, 32,
    ),
    "pong84": Workload(
        "RolloutBench/Pong84-v5", (4, 84, 84), True, 6, False, "Pong-v5",
        dict(_ATARI_ENVPOOL, img_height=84, img_width=84, gray_scale=True, stack_num=4, noop_max=30), 8, 64,
    ),
    "halfcheetah": Workload("HalfCheetah-v5", (17,), False, 6, True, "HalfCheetah-v4", {}, 16, 128),
}


def _register() -> None:
    """ale-py's ids and the preprocessed Pong's, in this process."""
    import workloads.atari_envs  # noqa: F401


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# -- the limit ------------------------------------------------------------------------------


def _env_worker(env_id: str, seed: int, seconds: float, barrier, out) -> None:
    import gymnasium as gym

    _register()
    env = gym.make(env_id)
    env.action_space.seed(seed)
    env.reset(seed=seed)
    # Random actions drawn beforehand: Box.sample() alone costs about half a HalfCheetah step.
    actions = [env.action_space.sample() for _ in range(1000)]
    for i in range(50):  # warm up
        _, _, te, tr, _ = env.step(actions[i])
        if te or tr:
            env.reset()
    barrier.wait()
    n, t0 = 0, time.perf_counter()
    while True:
        for _ in range(20):
            _, _, te, tr, _ = env.step(actions[n % 1000])
            n += 1
            if te or tr:
                env.reset()
        t = time.perf_counter() - t0
        if t >= seconds:
            break
    out.put(n / t)


def _onnx_model(w: Workload, actor) -> bytes:
    """The ONNX model ``rollout.DistributedCollector`` exports for this actor (the module's
    own exporter, on the env's spaces read from gymnasium)."""
    from rollout import _collector, _torch

    return _torch.export_policy(actor, _collector._env_specs(w.env, None, None)).model


def _forward_worker(workload: str, how: str, batch: int, seconds: float, barrier, out) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    w = WORKLOADS[workload]
    _register()
    torch.manual_seed(0)
    actor = w.actor()
    rng = np.random.default_rng(0)
    if w.image:
        obs = rng.integers(0, 255, (batch, *w.obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((batch, *w.obs_shape)).astype(np.float32)
    if how == "torch":
        from tensordict import TensorDict
        from torchrl.envs.utils import ExplorationType, set_exploration_type

        x = torch.from_numpy(obs)

        def call():
            with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
                actor(TensorDict({"observation": x}, [batch]))
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
        name = sess.get_inputs()[0].name
        feed = {name: obs}

        def call():
            sess.run(None, feed)

    for _ in range(3):
        call()
    barrier.wait()
    n, t0 = 0, time.perf_counter()
    while True:
        call()
        n += batch
        t = time.perf_counter() - t0
        if t >= seconds:
            break
    out.put(n / t)


def _all_cores(target, args_of, seconds: float, cores: int) -> float:
    """``target`` in one spawned process per core at once (released together by a barrier):
    the sum of what each put."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(cores), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(i), seconds, barrier, out)) for i in range(cores)]
    for p in procs:
        p.start()
    rates = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


def limit(args) -> dict:
    w = WORKLOADS[args.workload]
    cores = _cores()
    k = args.envs_per_node
    out: dict = {"run": "limit", "cores": cores, "batch": k}
    out["env_all"] = _all_cores(_env_worker, lambda i: (w.env, args.seed + i), args.seconds, cores)
    fwd = {}
    for how in ("torch", "ort-node", "ort-opt"):
        try:
            fwd[how] = _all_cores(_forward_worker, lambda i: (args.workload, how, k), args.seconds, cores)
        except Exception as e:  # e.g. an export the module refuses: say so, keep the others
            out[f"forward_{how}_error"] = repr(e)
    out.update({f"forward_{h}_all": v for h, v in fwd.items()})
    best = max(fwd, key=fwd.get)
    out["forward_best"] = best
    e, f = out["env_all"], fwd[best]
    out["fps"] = 1.0 / (1.0 / e + 1.0 / f)
    out["env_per_core"], out["forward_per_core"] = e / cores, f / cores
    return out


# -- collectors -----------------------------------------------------------------------------


class _TorchrlEnv:
    """One ``GymEnv`` of the workload (``DoubleToFloat`` on HalfCheetah), picklable."""

    def __init__(self, workload: str) -> None:
        self.workload = workload

    def __call__(self):
        from torchrl.envs import DoubleToFloat, GymEnv, RenameTransform, TransformedEnv

        _register()
        w = WORKLOADS[self.workload]
        # torchrl's GymEnv makes an ALE env with frameskip=frame_skip (default 1): ALE/Pong-v5's
        # own 4 is asked for here; the preprocessed id skips its 4 in AtariPreprocessing.
        if w.env.startswith("ALE/"):
            # torchrl names an RGB frame "pixels": renamed to the actor's in_key.
            return TransformedEnv(GymEnv(w.env, frame_skip=4), RenameTransform(["pixels"], ["observation"]))
        env = GymEnv(w.env)
        return TransformedEnv(env, DoubleToFloat()) if w.continuous else env


class _TorchrlEnvs:
    """``n`` of them in a ``SerialEnv`` (or a ``ParallelEnv``), picklable."""

    def __init__(self, workload: str, n: int, parallel: bool = False) -> None:
        self.workload, self.n, self.parallel = workload, n, parallel

    def __call__(self):
        from torchrl.envs import ParallelEnv, SerialEnv

        return (ParallelEnv if self.parallel else SerialEnv)(self.n, _TorchrlEnv(self.workload))


def make_collector(run: str, w: Workload, actor, frames_per_batch: int, args):
    k, nodes = args.envs_per_node, args.nodes
    if run == "rollout":
        import rollout

        cmd = [sys.executable, "-m", "rollout_node", "--import", "workloads.atari_envs"]
        if args.profile_nodes:
            cmd = [sys.executable, os.path.join(HERE, "workloads", "profiled_node.py"), args.profile_nodes,
                   "--import", "workloads.atari_envs"]
        kw = {}
        if args.envs_per_worker:
            kw["envs_per_worker"] = args.envs_per_worker
        return rollout.DistributedCollector(
            w.env, actor, frames_per_batch=frames_per_batch, total_frames=-1, nodes=nodes, envs_per_node=k,
            sync=args.sync, seed=args.seed, launcher="process", node_command=cmd, **kw,
        )
    if run == "torchrl-collector":
        from torchrl.collectors import Collector
        from torchrl.envs import ParallelEnv

        if args.torchrl_env == "nested":
            env = ParallelEnv(nodes, _TorchrlEnvs(args.workload, k))
        else:
            env = ParallelEnv(nodes * k, _TorchrlEnv(args.workload))
        c = Collector(env, actor, frames_per_batch=frames_per_batch, total_frames=-1)
        c.set_seed(args.seed)
        return c
    if run == "torchrl-multisync":
        from torchrl.collectors import MultiSyncCollector

        c = MultiSyncCollector(
            [_TorchrlEnvs(args.workload, k)] * nodes, actor, frames_per_batch=frames_per_batch, total_frames=-1,
        )
        c.set_seed(args.seed)
        return c
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
        del first
        t0, cpu0, frames, batches = time.perf_counter(), time.process_time(), 0, 0
        for td in it:
            frames += td.numel()
            batches += 1
            if time.perf_counter() - t0 >= args.seconds:
                break
        out["seconds"] = time.perf_counter() - t0
        # This process's CPU over the window (every thread): the trainer's share (receiving
        # and decoding batches, the TensorDicts) for rollout, the policy's for torchrl's Collector.
        out["this_process_cpu_s"] = time.process_time() - cpu0
        out["batches"], out["frames"] = batches, frames
        out["fps"] = frames / out["seconds"]
        if run == "rollout":
            out["stats"] = {k: v for k, v in c.stats().items() if isinstance(v, (int, float))}
    finally:
        c.shutdown()
    torch.set_num_threads(1)
    return out


class _Loop:
    """The torch loop of the ``gym-async`` and ``envpool`` runs: the actor on every env's
    observation, the step, the frame written into ``[T, N, ...]`` batch tensors."""

    def __init__(self, w: Workload, actor, n: int, steps: int) -> None:
        import torch

        self.w, self.actor, self.n, self.T = w, actor, n, steps
        odt = torch.uint8 if w.image else torch.float32
        adim = w.n_actions
        self.buf = {
            "observation": torch.empty(steps, n, *w.obs_shape, dtype=odt),
            "action": torch.empty(steps, n, adim, dtype=torch.float32 if w.continuous else torch.int64),
            "action_log_prob": torch.empty(steps, n),
            "reward": torch.empty(steps, n),
            "done": torch.empty(steps, n, dtype=torch.bool),
        }

    def act(self, obs):
        """The actor on ``obs`` ([N, ...] numpy): (action tensor, log-prob tensor)."""
        import torch
        from tensordict import TensorDict
        from torchrl.envs.utils import ExplorationType, set_exploration_type

        x = torch.from_numpy(obs)
        if not self.w.image and x.dtype != torch.float32:
            x = x.to(torch.float32)
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            td = self.actor(TensorDict({"observation": x}, [self.n]))
        return td["action"], td["action_log_prob"]

    def env_action(self, action):
        return action.numpy() if self.w.continuous else action.argmax(-1).numpy()

    def run(self, reset, step, seconds: float, hwc_from_chw: bool = False) -> dict:
        import numpy as np
        import torch

        obs = reset()
        b = self.buf
        frames, batches, t0, first = 0, 0, None, True
        while True:
            for t in range(self.T):
                o = np.moveaxis(obs, 1, -1) if hwc_from_chw else obs
                action, logp = self.act(o)
                b["observation"][t].copy_(torch.from_numpy(np.asarray(o)))
                b["action"][t].copy_(action)
                b["action_log_prob"][t].copy_(logp)
                obs, rew, term, trunc = step(self.env_action(action))
                b["reward"][t].copy_(torch.from_numpy(np.asarray(rew, dtype=np.float32)))
                b["done"][t].copy_(torch.from_numpy(np.logical_or(term, trunc)))
            if first:  # the first batch is start-up, as in the collector runs
                first, t0 = False, time.perf_counter()
                continue
            frames += self.T * self.n
            batches += 1
            if time.perf_counter() - t0 >= seconds:
                break
        s = time.perf_counter() - t0
        return {"seconds": s, "batches": batches, "frames": frames, "fps": frames / s, "batch_shape": [self.T, self.n]}


def gym_async_run(args) -> dict:
    import gymnasium as gym

    _register()
    w = WORKLOADS[args.workload]
    n = args.nodes * args.envs_per_node
    t0 = time.perf_counter()
    envs = gym.vector.AsyncVectorEnv(
        [_GymMake(w.env)] * n, shared_memory=True, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    try:
        loop = _Loop(w, w.actor(), n, args.steps)

        def step(a):
            o, r, te, tr, _ = envs.step(a)
            return o, r, te, tr

        out = {"run": "gym-async", "startup_s": time.perf_counter() - t0}
        out.update(loop.run(lambda: envs.reset(seed=args.seed)[0], step, args.seconds))
    finally:
        envs.close()
    return out


class _GymMake:
    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def __call__(self):
        import gymnasium as gym

        _register()
        return gym.make(self.env_id)


def envpool_run(args) -> dict:
    import envpool  # the caller checked it imports

    w = WORKLOADS[args.workload]
    n = args.nodes * args.envs_per_node
    t0 = time.perf_counter()
    envs = envpool.make(
        w.envpool_task, env_type="gymnasium", num_envs=n, num_threads=min(n, _cores()), seed=args.seed, **w.envpool_kwargs,
    )
    try:
        loop = _Loop(w, w.actor(), n, args.steps)

        def step(a):
            o, r, te, tr, _ = envs.step(a)
            return o, r, te, tr

        out = {"run": "envpool", "env": w.envpool_task, "startup_s": time.perf_counter() - t0}
        out.update(loop.run(lambda: envs.reset()[0], step, args.seconds, hwc_from_chw=args.workload == "pong-raw"))
    finally:
        envs.close()
    return out


def skipped(run: str, args) -> Optional[str]:
    """Why a run cannot be made here, or None."""
    import importlib.util

    if run == "envpool" and importlib.util.find_spec("envpool") is None:
        return "`import envpool` fails (not installed in this venv)"
    if run == "sample-factory" and not os.access(args.sf_python, os.X_OK):
        return (f"no Sample Factory venv at {args.sf_python}: `scripts/sf-venv.sh` makes one (sample-factory "
                "2.1.1 pins gymnasium<1.0 and numpy<2.0, so it cannot share this venv)")
    return None


def sf_command(args) -> list:
    """Sample Factory's run: workloads/sf_peer.py in its own venv, the same nodes, K and T."""
    return [args.sf_python, os.path.join(HERE, "workloads", "sf_peer.py"), "--workload", args.workload,
            "--seconds", str(args.seconds), "--workers", str(args.nodes), "--envs-per-worker",
            str(args.envs_per_node), "--rollout", str(args.steps), "--seed", str(args.seed)]


def sf_result(r: dict) -> dict:
    """sf_peer.py's line as one of this script's results (a KeyError if it lacks a field)."""
    return {"run": "sample-factory", "fps": r["frames_per_s"], "startup_s": r["startup_s"],
            "batch_shape": [r["envs_total"], r["rollout"]], "seconds": r["seconds"], "frames": r["frames"],
            "env": r["env"], "inference_workers": r["inference_workers"], "worker_num_splits": r["worker_num_splits"],
            "params": r["model"]["params"], "window_cpu_s": r["window_cpu_s"],
            "window_cpu_s_by_process": r.get("window_cpu_s_by_process"), "versions": r["versions"]}


def one(run: str, args) -> dict:
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    _register()
    if run == "limit":
        return limit(args)
    if run == "gym-async":
        return gym_async_run(args)
    if run == "envpool":
        return envpool_run(args)
    return collector_run(run, args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds each measurement counts (after start-up)")
    p.add_argument("--nodes", type=int, default=None, help="nodes / worker processes (default: the cores)")
    p.add_argument("--envs-per-node", type=int, default=None, help="K (default: the workload's)")
    p.add_argument("--steps", type=int, default=None, help="T, steps of each env per batch (default: the workload's)")
    p.add_argument("--envs-per-worker", type=int, default=None, help="rollout's envs_per_worker")
    p.add_argument("--sync", action="store_true", help="rollout sync (default: async)")
    p.add_argument("--torchrl-env", default="flat", choices=("flat", "nested"),
                   help="torchrl Collector's env: a ParallelEnv of the 2K envs (flat) or of --nodes SerialEnvs of K (nested)")
    p.add_argument("--profile-nodes", default=None, metavar="PREFIX",
                   help="rollout's nodes run under cProfile, written to PREFIX.<pid>.prof")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sf-python", default=os.path.join(ROOT, ".venv-sf", "bin", "python"),
                   help="the Python of a venv with sample-factory 2.1.1 (scripts/sf-venv.sh)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of the runs; each round rotates the peers' order by one")
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
    print(f"workload {args.workload}: {w.env}, {args.nodes} x {args.envs_per_node} envs, {args.steps} steps per env "
          f"per batch, {_cores()} cores; load before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    results = []
    runs = []
    asked = args.runs.split(",")
    peers = [r for r in asked if r != "limit"]
    for i in range(args.rounds):
        # Each round starts its peers one further along (rollout first in round 1, second in
        # round 2, ...), so a host that slows down during a round does not favour one run.
        k = i % len(peers) if peers else 0
        turn = peers[k:] + peers[:k]
        runs += [r if r == "limit" else turn.pop(0) for r in asked]
    if "limit" in runs and runs[-1] != "limit" and not args.limit_once:
        runs.append("limit")  # the limit before and after the runs: L is their mean
    for run in runs:
        why = skipped(run, args)
        if why:
            print(f"{run}: skipped: {why}", flush=True)
            continue
        if run == "sample-factory":
            cmd = sf_command(args)
        else:
            cmd = [sys.executable, os.path.abspath(__file__), "--one", run] + sys.argv[1:]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:  # a collector whose workers died can wait for ever: give each run a deadline
            stdout, stderr = proc.communicate(timeout=2 * args.seconds + 150)
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
        try:
            r = json.loads(lines[-1])
            if run == "sample-factory":
                r = sf_result(r)
        except (ValueError, KeyError) as e:
            print(f"{run}: failed: its result line lacks {e} (or is not JSON)", flush=True)
            continue
        results.append(r)
        print(json.dumps(r), flush=True)
    load = os.getloadavg()
    print(f"load after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    lim = [r["fps"] for r in results if r["run"] == "limit"]
    lim_fps = sum(lim) / len(lim) if lim else None
    if len(lim) > 1:
        print(f"limit: {len(lim)} measurements, {min(lim):,.0f} to {max(lim):,.0f} frames/s; ratios are to their mean {lim_fps:,.0f}")
    for r in results:
        if r["run"] == "limit":
            print(f"limit: env alone {r['env_all']:,.0f} steps/s on {r['cores']} cores ({r['env_per_core']:,.0f} per core); "
                  f"forward alone at batch {r['batch']}: " + ", ".join(
                      f"{h} {r[f'forward_{h}_all']:,.0f}" for h in ("torch", "ort-node", "ort-opt") if f"forward_{h}_all" in r)
                  + f" frames/s on {r['cores']} cores; L = 1/(1/E + 1/F[{r['forward_best']}]) = {r['fps']:,.0f} frames/s")
    print("| run | batch shape | frames/s | x limit | start-up (s) |")
    print("|---|---|---|---|---|")
    for r in results:
        ratio = f"{r['fps'] / lim_fps:.2f}" if lim_fps else "-"
        print(f"| {r['run']} | {r.get('batch_shape', '-')} | {r['fps']:,.0f} | {ratio} | {r.get('startup_s', 0):.1f} |")


if __name__ == "__main__":
    main()
