"""Sample Factory 2.1.1 as a sampling-only peer of the workload bench (issue 43):
env steps/s on the CPU, printed as one JSON line.

Sample Factory 2.1.1 pins gymnasium < 1.0 and numpy < 2.0, so it cannot share the
project's venv: this script runs in a venv of its own, made by ``scripts/sf-venv.sh``
(``.venv-sf``), and ``bench_workloads.py`` starts it there for its ``sample-factory``
run. By hand:

    .venv-sf/bin/python python/collector/bench/workloads/sf_peer.py --workload halfcheetah --seconds 20

It runs Sample Factory's own sampler with no learner: ``SyncSamplingAPI``
(sample_factory/algo/sampling/simplified_sampling_api.py, the API of
sf_examples/sampler/use_simplified_sampling_api.py), a ``SamplingLoop`` driving its
``ParallelSampler`` (``--workers`` rollout-worker processes and inference-worker
processes, all spawned), with randomly initialised weights. Each finished trajectory
(``--rollout`` steps of one env) is counted as its env steps (``samples_per_trajectory``)
over ``--seconds`` after ``--warmup`` seconds from the first one. One frame is one
``env.step`` call (4 emulator frames on Pong: ``env_frameskip`` is 1, so Sample Factory
multiplies nothing). ``--count-steps`` also counts the ``step`` calls inside the envs as a
cross-check of that count.

Workloads (the other peers run gymnasium 1.x's envs; this venv has gymnasium 0.29):

- ``halfcheetah``: ``HalfCheetah-v4`` (0.29 has no v5; EnvPool's peer runs v4 too), an MLP
  encoder 256-256 ReLU, Sample Factory's continuous head (``Linear(256, 12)``: mean and
  log-std of a diagonal Normal, no tanh) and its value head ``Linear(256, 1)``;
  non-batched sampling, ``worker_num_splits`` 2 (its default double buffering), 1
  inference worker (its default; 2 were slower here).
- ``pong-raw``: ``ALE/Pong-v5`` raw (210x160x3 uint8, frame skip 4, sticky actions) under
  its ``PixelFormatChwWrapper`` (HWC to CHW), its ``convnet_atari`` encoder (conv 32 8x8/4,
  64 4x4/2, 64 3x3/1) and a 512 ReLU layer (the Nature-CNN), a Categorical head; split 1
  and 2 inference workers (the CNN's forward is the bottleneck: its default of one
  single-threaded inference worker leaves a core idle; 1.7-1.9 x faster here).
- ``pong84``: ``ALE/Pong-v5`` (``frameskip=1``) under gymnasium 0.29's ``AtariPreprocessing``
  (no-op starts, frame skip 4, 84x84 gray) and a stack of 4, uint8 ``[4, 84, 84]``: the
  bench's ``RolloutBench/Pong84-v5``; the same encoder, Sample Factory's default knobs
  (split 2, 1 inference worker: the fastest of the four tried here, the env being the
  larger cost on this one).

Every workload: device cpu, no RNN, no input normalisation (the peers' actors do not
normalise), one torch thread per worker process, Sample Factory's CPU affinity (worker i on core
i) and its niceness for its workers (rollout +10, inference +2). ``--workers``,
``--envs-per-worker``, ``--rollout``, ``--splits``, ``--inference-workers`` and
``--batched`` override.

ale-py 0.12 under gymnasium 0.29: ``import ale_py`` registers no ``ALE/*`` id (its import
of ``gymnasium.vector.AutoresetMode`` fails inside a ``try``), so the envs here register
them with ``ale_py.registration``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

WORKLOADS = {
    # name: (SF env name, num_workers, envs per worker, rollout T): bench_workloads.py's defaults
    "halfcheetah": ("sfpeer_halfcheetah_v4", 2, 16, 128),
    "pong-raw": ("sfpeer_pong_raw_v5", 2, 4, 32),
    "pong84": ("sfpeer_pong84_v5", 2, 8, 64),
}
# SF's sampling knobs per workload, the fastest found on this 2-core machine (see the report):
# (worker_num_splits, policy_workers_per_policy, batched_sampling)
SAMPLING_DEFAULTS = {
    "halfcheetah": (2, 1, "False"),  # SF's own defaults (and sf_examples/mujoco's)
    "pong-raw": (1, 2, "False"),  # the CNN forward is the bottleneck: 2 inference workers, 4-env requests
    "pong84": (2, 1, "False"),  # SF's defaults: 1,513 env steps/s against 1,309-1,404 for the others (10 s each)
}
COUNT_DIR = os.environ.get("SF_PEER_COUNT_DIR")  # set by --count-steps: envs write their step counts here


class _StepCounter:
    """Optional cross-check (--count-steps): counts this env's step() calls and writes the
    count to a file every 64 steps, so the harness can count env steps independently of SF."""

    def __init__(self, env):
        import uuid

        self._env = env
        self._n = 0
        self._path = os.path.join(COUNT_DIR, f"{os.getpid()}.{uuid.uuid4().hex[:8]}")

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, action):
        self._n += 1
        if self._n % 64 == 0:
            with open(self._path + ".tmp", "w") as f:
                f.write(str(self._n))
            os.replace(self._path + ".tmp", self._path)
        return self._env.step(action)


def _maybe_count(env):
    """``env`` under a step counter with ``--count-steps`` (the workers inherit the directory), else itself."""
    if not COUNT_DIR:
        return env
    import gymnasium as gym

    class StepCounter(gym.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self._c = _StepCounter(env)

        def step(self, action):
            return self._c.step(action)

    return StepCounter(env)


def counted_steps() -> int:
    """The env steps the envs' counters have written so far, summed."""
    total = 0
    for name in os.listdir(COUNT_DIR):
        if name.endswith(".tmp"):
            continue
        try:
            with open(os.path.join(COUNT_DIR, name)) as f:
                total += int(f.read() or 0)
        except (OSError, ValueError):
            pass
    return total


def make_halfcheetah(env_name, cfg=None, env_config=None, render_mode=None, **kwargs):
    """Sample Factory's env factory for ``halfcheetah``: gymnasium 0.29's HalfCheetah-v4."""
    import gymnasium as gym

    return _maybe_count(gym.make("HalfCheetah-v4", render_mode=render_mode))


def make_pong_raw(env_name, cfg=None, env_config=None, render_mode=None, **kwargs):
    """Sample Factory's env factory for ``pong-raw``: ALE/Pong-v5's raw frames, channels first."""
    import gymnasium as gym

    _register_ale()
    from sample_factory.envs.env_wrappers import PixelFormatChwWrapper

    env = gym.make("ALE/Pong-v5", render_mode=render_mode)  # frameskip=4, repeat_action_probability=0.25
    return PixelFormatChwWrapper(_maybe_count(env))


def make_pong84(env_name, cfg=None, env_config=None, render_mode=None, **kwargs):
    """Sample Factory's env factory for ``pong84``: the bench's ``RolloutBench/Pong84-v5`` in gymnasium 0.29."""
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, FrameStack

    _register_ale()
    env = gym.make("ALE/Pong-v5", frameskip=1, render_mode=render_mode)
    env = AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True, scale_obs=False)
    return _Stacked(FrameStack(_maybe_count(env), 4))


def _Stacked(env):
    """0.29's ``FrameStack`` returns ``LazyFrames``: made one uint8 ``[4, 84, 84]`` array."""
    import gymnasium as gym
    import numpy as np

    class Stacked(gym.ObservationWrapper):
        def observation(self, obs):
            return np.asarray(obs, dtype=np.uint8)

    return Stacked(env)


def _register_ale():
    """ale-py 0.12.1's ``import ale_py`` registers nothing under gymnasium 0.29 (its
    vector_env import of gymnasium.vector.AutoresetMode fails inside a try): register here."""
    import gymnasium as gym
    import ale_py  # noqa: F401

    if "ALE/Pong-v5" not in gym.registry:
        from ale_py.registration import register_v0_v4_envs, register_v5_envs

        register_v0_v4_envs()
        register_v5_envs()


def register_components():
    """The workloads' envs, registered with Sample Factory (in every process it spawns, by import)."""
    from sample_factory.envs.env_utils import register_env

    register_env(WORKLOADS["halfcheetah"][0], make_halfcheetah)
    register_env(WORKLOADS["pong-raw"][0], make_pong_raw)
    register_env(WORKLOADS["pong84"][0], make_pong84)


def sf_argv(args) -> list:
    """Sample Factory's command line for this run: the workload's env and encoder, its knobs, CPU only."""
    env, workers, epw, rollout = WORKLOADS[args.workload]
    workers = args.workers or workers
    epw = args.envs_per_worker or epw
    rollout = args.rollout or rollout
    argv = [
        f"--env={env}",
        "--experiment=sf_peer_" + args.workload.replace("-", "_"),
        f"--train_dir={args.train_dir}",
        "--device=cpu",
        f"--num_workers={workers}",
        f"--num_envs_per_worker={epw}",
        f"--worker_num_splits={args.splits}",
        f"--rollout={rollout}",
        f"--batched_sampling={args.batched}",
        "--async_rl=True",
        "--serial_mode=False",
        "--num_policies=1",
        f"--policy_workers_per_policy={args.inference_workers}",
        "--use_rnn=False",
        "--nonlinearity=relu",
        "--normalize_input=False",
        "--env_frameskip=1",
        "--summaries_use_frameskip=False",
        "--decorrelate_experience_max_seconds=0",
        "--with_wandb=False",
        f"--seed={args.seed}",
    ]
    if args.workload == "halfcheetah":
        argv += ["--encoder_mlp_layers", "256", "256", "--adaptive_stddev=True", "--obs_scale=1.0"]
    else:
        argv += ["--encoder_conv_architecture=convnet_atari", "--encoder_conv_mlp_layers", "512", "--obs_scale=255.0"]
    return argv


def describe_model(cfg, env_info) -> dict:
    """The actor-critic Sample Factory builds for ``cfg``: its class, parameters and layers."""
    from sample_factory.model.actor_critic import create_actor_critic

    ac = create_actor_critic(cfg, env_info.obs_space, env_info.action_space)
    n = sum(p.numel() for p in ac.parameters())
    return {"class": type(ac).__name__, "params": n, "modules": str(ac).replace("\n", " ").replace("  ", "")}


def main() -> None:
    """Runs the sampler, counts its env steps over the window, prints the JSON line."""
    p = argparse.ArgumentParser()
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--seconds", type=float, default=20.0, help="measurement window after warm-up")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds after the first trajectory not counted")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--envs-per-worker", type=int, default=None)
    p.add_argument("--rollout", type=int, default=None)
    p.add_argument("--splits", type=int, default=None, help="SF worker_num_splits (2: double-buffered sampling)")
    p.add_argument("--batched", default=None, choices=("True", "False"), help="SF batched_sampling")
    p.add_argument("--inference-workers", type=int, default=None, help="SF policy_workers_per_policy (1 torch thread each on CPU)")
    p.add_argument("--count-steps", action="store_true", help="cross-check: also count env.step calls in the envs themselves")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train_dir", default=None, help="Sample Factory's experiment directory (default: a temporary one, removed)")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds after which the run gives up, cleaning up (default: warm-up + window + 300)")
    args = p.parse_args()
    # Sample Factory waits for its workers without a deadline (a worker that dies at start-up
    # leaves `start()` waiting): the run's own bound, raised in the main thread so that the
    # `finally` below stops the sampler and ends the workers.
    import signal

    def _late(signum, frame):
        raise TimeoutError(f"sf_peer: no result within {deadline:.0f} s")

    deadline = args.deadline if args.deadline is not None else args.warmup + args.seconds + 300
    signal.signal(signal.SIGALRM, _late)
    signal.setitimer(signal.ITIMER_REAL, deadline)
    d_splits, d_iw, d_batched = SAMPLING_DEFAULTS[args.workload]
    args.splits = args.splits or d_splits
    args.inference_workers = args.inference_workers or d_iw
    args.batched = args.batched or d_batched
    own_dir = None
    if args.train_dir is None:
        import tempfile

        own_dir = args.train_dir = tempfile.mkdtemp(prefix="sf_peer_train_")
    if args.count_steps:
        import tempfile

        global COUNT_DIR
        COUNT_DIR = tempfile.mkdtemp(prefix="sf_peer_counts_")
        os.environ["SF_PEER_COUNT_DIR"] = COUNT_DIR  # spawned workers inherit it

    import logging

    from sample_factory.algo.sampling.simplified_sampling_api import SyncSamplingAPI
    from sample_factory.algo.utils.env_info import obtain_env_info_in_a_separate_process
    from sample_factory.algo.utils.rl_utils import samples_per_trajectory
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.utils.utils import log

    if not args.verbose:
        log.setLevel(logging.WARNING)
        for h in log.handlers:
            h.setLevel(logging.WARNING)

    try:
        register_components()
        argv = sf_argv(args)
        parser, _ = parse_sf_args(argv=argv)
        cfg = parse_full_cfg(parser, argv)
        t_start = time.perf_counter()
        env_info = obtain_env_info_in_a_separate_process(cfg)
        model = describe_model(cfg, env_info)
    except BaseException:
        _remove(COUNT_DIR, own_dir)
        raise

    load_before = os.getloadavg()
    out = {"peer": "sample-factory", "workload": args.workload}
    status = sampler = None
    try:
        sampler = SyncSamplingAPI(cfg, env_info)
        sampler.start()
        traj = sampler.get_trajectories_sync()
        if traj is None:
            raise RuntimeError("Sample Factory's sampler stopped before its first trajectory")
        t_first = time.perf_counter()
        out["startup_s"] = t_first - t_start
        out["trajectory_shape_obs"] = list(traj["obs"]["obs"].shape) if "obs" in traj else None
        out["trajectory_rewards_shape"] = list(traj["rewards"].shape)
        while time.perf_counter() - t_first < args.warmup:
            traj = sampler.get_trajectories_sync()
        t0, cpu0 = time.perf_counter(), time.process_time()
        sys0, tree0 = _system_cpu(), _tree_cpu()
        counted0 = counted_steps() if COUNT_DIR else None
        frames, n_traj = 0, 0
        while True:
            traj = sampler.get_trajectories_sync()
            if traj is None:
                raise RuntimeError("sampler stopped")
            frames += samples_per_trajectory(traj)
            n_traj += 1
            if time.perf_counter() - t0 >= args.seconds:
                break
        dt = time.perf_counter() - t0
        sys1, tree1 = _system_cpu(), _tree_cpu()
        if COUNT_DIR:
            out["cross_check_env_steps_per_s"] = (counted_steps() - counted0) / dt
        # CPU seconds over the window: all cores' busy time (/proc/stat), this run's process
        # tree (this process and SF's workers), and the rest (other users of the machine).
        busy = sys1 - sys0
        mine = sum(tree1.get(k, 0.0) - tree0.get(k, 0.0) for k in tree1)
        out["window_cpu_s"] = {"machine_busy": round(busy, 2), "this_run": round(mine, 2),
                               "others": round(busy - mine, 2), "available": round(dt * os.cpu_count(), 2)}
        out["window_cpu_s_by_process"] = _by_role(tree0, tree1)
        out.update(
            seconds=dt,
            frames=frames,
            trajectories=n_traj,
            frames_per_s=frames / dt,
            main_process_cpu_s=time.process_time() - cpu0,
        )
    finally:
        if sampler is not None:
            status = sampler.stop()
        out["children_terminated_by_harness"] = _kill_children()
        _remove(COUNT_DIR, own_dir)
    load_after = os.getloadavg()
    out.update(
        env={"halfcheetah": "gymnasium 0.29 HalfCheetah-v4", "pong-raw": "ALE/Pong-v5 raw RGB, CHW transpose",
             "pong84": "ALE/Pong-v5, AtariPreprocessing 84x84 gray, a stack of 4"}[args.workload],
        workers=cfg.num_workers,
        envs_per_worker=cfg.num_envs_per_worker,
        envs_total=cfg.num_workers * cfg.num_envs_per_worker,
        worker_num_splits=cfg.worker_num_splits,
        batched_sampling=cfg.batched_sampling,
        rollout=cfg.rollout,
        inference_workers=cfg.policy_workers_per_policy * cfg.num_policies,
        device="cpu",
        learner="none (SyncSamplingAPI, random weights)",
        warmup_s=args.warmup,
        sf_status=int(status) if status is not None else None,
        model=model,
        loadavg_before=[round(x, 2) for x in load_before],
        loadavg_after=[round(x, 2) for x in load_after],
        versions=_versions(),
    )
    print(json.dumps(out), flush=True)


def _system_cpu() -> float:
    """Busy CPU seconds of the whole machine so far (user+nice+system+irq+softirq+steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def _tree_cpu() -> dict:
    """CPU seconds (user+system) of this process and each of its descendants, by pid."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me] + me.children(recursive=True):
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def _by_role(tree0: dict, tree1: dict) -> dict:
    """This run's window CPU seconds per process. SF renices its inference workers to +2 and
    its rollout workers to +10 (when num_workers > 1), which tells them apart. Processes
    using < 0.05 s (the env-info / resource-tracker helpers) are left out."""
    import psutil

    out = {}
    for pid, t in tree1.items():
        d = t - tree0.get(pid, 0.0)
        if d < 0.05:
            continue
        if pid == os.getpid():
            role = "main"
        else:
            try:
                nice = psutil.Process(pid).nice()
                role = {2: "inference", 10: "rollout"}.get(nice, f"nice{nice}")
            except psutil.NoSuchProcess:
                role = "gone"
        out[f"{role}:{pid}"] = round(d, 2)
    return out


def _versions() -> dict:
    from importlib.metadata import version

    return {k: version(k) for k in ("sample-factory", "gymnasium", "numpy", "torch", "mujoco", "ale-py")}


def _remove(*dirs) -> None:
    """The temporary directories this run made (None for one it did not)."""
    import shutil

    for d in dirs:
        if d:
            shutil.rmtree(d, ignore_errors=True)


def _kill_children() -> int:
    """End any process SF left behind (children of this process only): after SF's own
    stop, give them 10 s to exit, then terminate, then kill. multiprocessing's
    resource tracker is left alone (it exits with this process)."""
    import psutil

    def left():
        out = []
        for k in psutil.Process().children(recursive=True):
            try:
                if "resource_tracker" not in " ".join(k.cmdline()):
                    out.append(k)
            except psutil.NoSuchProcess:
                pass
        return out

    deadline = time.time() + 10
    while left() and time.time() < deadline:
        time.sleep(0.2)
    kids = left()
    for k in kids:
        try:
            k.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(kids, timeout=5)
    for k in alive:
        try:
            k.kill()
        except psutil.NoSuchProcess:
            pass
    return len(kids)


if __name__ == "__main__":
    main()
