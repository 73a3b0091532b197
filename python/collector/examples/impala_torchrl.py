"""IMPALA with torchrl's V-trace on CartPole-v1 or Pendulum-v1, collecting through
rollout's async ``DistributedCollector``.

IMPALA's learner does not wait for the nodes to act with its latest weights: each
batch comes from one node at a time (``sync=False``, first ready first served), and
after every optimisation step the new weights are pushed to the nodes
(``collector.update_policy_weights_()``), which go on collecting with whatever
version reached them. So a batch was collected by weights one or more versions
older than the learner's, and V-trace corrects for that lag with the importance
weights ``rho = pi(a | x) / mu(a | x)``, where ``mu`` is the behaviour policy that
acted:

- the behaviour log-prob ``log mu(a | x)`` of each frame is the one the node recorded
  while acting (``action_log_prob``, the exported ``ProbabilisticActor`` 's own);
- the version of each frame is in the batch too (``policy_version`` with
  ``track_policy_version=True``, as torchrl writes it; ``("collector",
  "weights_version")`` always): :class:`PolicyVersions` keeps the actor's
  ``state_dict`` of every version that may still arrive, so the recorded log-probs
  can be checked against the actor of the frame's version (the tests do, per frame);
- ``log pi(a | x)`` is the learner's actor now, on the frame's observation and
  recorded action.

The learner is torchrl's: the actor and critic of ``ppo_torchrl.py`` (64-64 tanh MLPs;
``OneHotCategorical`` on CartPole, ``TanhNormal`` with a ``NormalParamExtractor`` on
Pendulum, its location bounded by ``tanh_loc``), V-trace targets and advantages from torchrl's
``torchrl.objectives.value.functional.vtrace_advantage_estimate`` (:func:`vtrace`),
and ``A2CLoss`` on them: the policy gradient ``-log pi(a | x) * advantage``, the
critic's loss to the V-trace targets, an entropy bonus; Adam, one step per batch.

torchrl's ``VTrace`` module (0.14) calls the same function, but scores ``log pi`` on
an action its actor draws anew (the mode by default, a fresh sample under
``ExplorationType.RANDOM``) rather than on the batch's action, so its ``rho`` is not
the taken action's once the batch lags the learner (on a batch of the learner's own
weights the clipping at 1 hides it). :func:`vtrace` therefore calls the function
itself; a test pins the difference.

    python python/collector/examples/impala_torchrl.py --env CartPole-v1 --stop-at-threshold
    python python/collector/examples/impala_torchrl.py --env Pendulum-v1 --stop-at-threshold

Each batch prints the frames so far, the mean return of the last 20 episodes, the
mean and largest policy lag of its frames (versions behind the learner's when it
arrived), the mean V-trace ``rho``, the seconds since the first batch was asked for and the share of them spent
waiting for batches. :func:`train` returns the same as a :class:`History`.
``--max-policy-lag`` and ``--prefetch`` go to the collector when they are given
(:func:`make_collector`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional

import torch
from tensordict import TensorDictBase
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.modules import OneHotCategorical, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import A2CLoss
from torchrl.objectives.value.functional import vtrace_advantage_estimate

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ppo_torchrl import EpisodeReturns, mlp  # noqa: E402 - the same nets and episode bookkeeping as the PPO example


@dataclasses.dataclass
class Task:
    """What differs between the two envs: sizes, hyperparameters, the return to reach
    and the frame budget. ``reward_scale`` multiplies the rewards V-trace reads (not
    the returns reported); ``normalize_advantage`` standardises each batch's V-trace
    advantages; ``upscale`` bounds a ``TanhNormal`` 's location (torchrl's
    ``tanh_loc=True``) so that its samples stay off the action's bounds, where the
    recorded (float32) action no longer tells which pre-tanh value was drawn;
    ``rho_thresh`` and ``c_thresh`` are V-trace's clipping thresholds."""

    env: str
    obs_dim: int
    action_dim: int
    continuous: bool
    threshold: float
    frames: int
    frames_per_batch: int
    lr: float
    gamma: float
    entropy_coeff: float
    critic_coeff: float
    critic_loss: str
    reward_scale: float = 1.0
    normalize_advantage: bool = False
    upscale: Optional[float] = None
    rho_thresh: float = 1.0
    c_thresh: float = 1.0
    max_grad_norm: float = 1.0
    action_low: float = -1.0
    action_high: float = 1.0


TASKS: Dict[str, Task] = {
    "CartPole-v1": Task("CartPole-v1", 4, 2, False, 475.0, 1_000_000, 256, 1e-3, 0.99, 0.01, 0.5, "smooth_l1"),
    "Pendulum-v1": Task("Pendulum-v1", 3, 1, True, -200.0, 2_000_000, 128, 3e-4, 0.9, 1e-2, 0.5, "l2", 0.1,
                        normalize_advantage=True, upscale=3.0, action_low=-2.0, action_high=2.0),
}


def _tanh_normal_kwargs(task: Task) -> Dict[str, float]:
    """``TanhNormal`` 's keyword arguments: the env's bounds, and ``tanh_loc`` with
    ``task.upscale`` when it is set."""
    kwargs = {"low": task.action_low, "high": task.action_high}
    if task.upscale is not None:
        kwargs.update(tanh_loc=True, upscale=task.upscale)
    return kwargs


def make_actor_critic(task: Task):
    """The actor (a ``ProbabilisticActor`` recording ``action_log_prob``) and the critic
    (a ``ValueOperator`` writing ``state_value``), as ``ppo_torchrl.py`` builds them."""
    if task.continuous:
        net = nn.Sequential(mlp(task.obs_dim, 2 * task.action_dim), NormalParamExtractor())
        actor = ProbabilisticActor(
            TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
            in_keys=["loc", "scale"],
            distribution_class=TanhNormal,
            distribution_kwargs=_tanh_normal_kwargs(task),
            return_log_prob=True,
        )
    else:
        actor = ProbabilisticActor(
            TensorDictModule(mlp(task.obs_dim, task.action_dim), in_keys=["observation"], out_keys=["logits"]),
            in_keys=["logits"],
            distribution_class=OneHotCategorical,
            return_log_prob=True,
        )
    critic = ValueOperator(mlp(task.obs_dim, 1), in_keys=["observation"])
    return actor, critic


def make_collector(
    task: Task,
    actor,
    total_frames: int,
    nodes: int = 2,
    envs_per_node: int = 4,
    seed: int = 0,
    launcher: str = "local",
    node_command: Optional[List[str]] = None,
    max_policy_lag: Optional[int] = None,
    prefetch: Optional[int] = None,
):
    """rollout's async collector over ``nodes`` nodes of ``envs_per_node`` envs each, the
    actor itself as its policy: batches of ``task.frames_per_batch`` frames, each from one
    node (``[envs_per_node, T]``), carrying every frame's ``policy_version``. One worker
    steps a node's envs together (``envs_per_worker=envs_per_node``): each worker applies
    every weight push, which costs a ``TanhNormal`` actor about 10 ms a worker
    (measured: with a push per 128-frame batch, Pendulum's next batch took 46 ms with a
    worker per env, 11 ms with one per node; CartPole's under 1 ms either way).
    ``max_policy_lag`` and ``prefetch`` are passed on only when given (the collector's
    defaults otherwise)."""
    import rollout

    extra = {}
    if max_policy_lag is not None:
        extra["max_policy_lag"] = max_policy_lag
    if prefetch is not None:
        extra["prefetch"] = prefetch
    return rollout.DistributedCollector(
        task.env, actor, frames_per_batch=task.frames_per_batch, total_frames=total_frames,
        nodes=nodes, envs_per_node=envs_per_node, envs_per_worker=envs_per_node, sync=False, seed=seed, launcher=launcher,
        node_command=node_command, track_policy_version=True, **extra,
    )


class PolicyVersions:
    """The actor's ``state_dict`` for each weights version that may still be in a batch
    (version -> a copy of the tensors), and :meth:`actor` to run one of them.

    A node's frames never go back to an older version than the ones it already
    delivered, so every version below the oldest in each node's latest batch is
    dropped (:meth:`seen`); a node not heard from yet keeps everything."""

    def __init__(self, actor: nn.Module, nodes: int) -> None:
        self.states: Dict[int, Dict[str, torch.Tensor]] = {}
        self._floor: List[int] = [0] * nodes
        self._shadow = copy.deepcopy(actor)
        self._loaded: Optional[int] = None
        self.add(0, actor)

    def add(self, version: int, actor: nn.Module) -> None:
        """Keeps ``actor``'s current parameters as ``version`` (what
        ``update_policy_weights_()`` just pushed)."""
        self.states[version] = {k: v.detach().clone() for k, v in actor.state_dict().items()}

    def seen(self, td: TensorDictBase) -> None:
        """Notes the versions of a batch from one node and drops the versions no node
        can deliver any more."""
        node = int(td["collector", "node"].reshape(-1)[0])
        self._floor[node] = max(self._floor[node], int(td["policy_version"].min()))
        floor = min(self._floor)
        for version in [v for v in self.states if v < floor]:
            del self.states[version]

    def actor(self, version: int) -> nn.Module:
        """A copy of the actor holding ``version``'s parameters (one copy, reloaded when
        another version is asked for)."""
        if version not in self.states:
            raise KeyError(f"weights version {version} is not kept (kept: {sorted(self.states)})")
        if self._loaded != version:
            self._shadow.load_state_dict(self.states[version])
            self._loaded = version
        return self._shadow

    def log_prob(self, td: TensorDictBase) -> torch.Tensor:
        """The log-prob of each frame's action under the actor of that frame's version
        (``policy_version``), shaped as the batch: what the node should have recorded."""
        out = torch.empty(td.batch_size)
        versions = td["policy_version"]
        with torch.no_grad():
            for version in versions.unique().tolist():
                mask = versions == version
                frames = td[mask]
                out[mask] = self.actor(version).get_dist(frames).log_prob(frames["action"])
        return out


def vtrace(task: Task, data: TensorDictBase, actor, critic) -> Dict[str, float]:
    """Writes V-trace's ``advantage`` and ``value_target`` into ``data`` (a node's batch,
    ``[envs, T]`` or ``[T]``, time last), with torchrl's ``vtrace_advantage_estimate``:
    ``log mu`` the recorded ``action_log_prob``, ``log pi`` the actor's now on the
    recorded actions, values and next values from the critic (``("next",
    "observation")`` bootstraps the batch's last frame and truncated episodes), the
    reward times ``task.reward_scale``. Returns the mean ``rho`` and the share clipped."""
    with torch.no_grad():
        value = critic(data.select(*critic.in_keys))["state_value"]
        next_value = critic(data["next"].select(*critic.in_keys))["state_value"]
        log_pi = actor.get_dist(data.select(*actor.in_keys)).log_prob(data["action"]).unsqueeze(-1)
        log_mu = data["action_log_prob"].unsqueeze(-1)
        advantage, target = vtrace_advantage_estimate(
            task.gamma, log_pi, log_mu, value, next_value,
            data["next", "reward"] * task.reward_scale, data["next", "done"], data["next", "terminated"],
            rho_thresh=task.rho_thresh, c_thresh=task.c_thresh, time_dim=-2,
        )
    if task.normalize_advantage:
        advantage = (advantage - advantage.mean()) / advantage.std().clamp_min(1e-6)
    data.set("advantage", advantage)
    data.set("value_target", target)
    rho = (log_pi - log_mu).exp()
    return {"rho": rho.mean().item(), "clipped": (rho > task.rho_thresh).float().mean().item()}


def make_loss(task: Task, actor, critic) -> A2CLoss:
    """torchrl's ``A2CLoss``: ``-log pi(a | x) * advantage``, the critic's loss to
    ``value_target`` and the entropy bonus (none when ``task.entropy_coeff`` is 0)."""
    return A2CLoss(
        actor, critic, entropy_bonus=task.entropy_coeff > 0, entropy_coeff=task.entropy_coeff,
        critic_coeff=task.critic_coeff, loss_critic_type=task.critic_loss,
    )


@dataclasses.dataclass
class History:
    """Per batch: frames so far, mean return of the last 20 episodes (None before 20),
    seconds since the first batch was asked for, of which waiting for batches; the
    mean and largest policy lag of its frames (the learner's version when it arrived
    minus the frame's), its versions, the mean V-trace ``rho`` and the share of frames
    whose ``rho`` was clipped; and when the threshold was first reached."""

    frames: List[int] = dataclasses.field(default_factory=list)
    returns: List[Optional[float]] = dataclasses.field(default_factory=list)
    wall: List[float] = dataclasses.field(default_factory=list)
    waited: List[float] = dataclasses.field(default_factory=list)
    lag: List[float] = dataclasses.field(default_factory=list)
    max_lag: List[int] = dataclasses.field(default_factory=list)
    versions: List[List[int]] = dataclasses.field(default_factory=list)
    rho: List[float] = dataclasses.field(default_factory=list)
    clipped: List[float] = dataclasses.field(default_factory=list)
    solved_at: Optional[int] = None
    solved_wall: Optional[float] = None
    solved_waited: Optional[float] = None

    @property
    def best(self) -> float:
        """The best mean return of the last 20 episodes seen."""
        seen = [r for r in self.returns if r is not None]
        return max(seen) if seen else float("-inf")


def train(
    task: Task,
    collector,
    actor,
    critic,
    total_frames: int,
    stop_at_threshold: bool = False,
    on_batch: Optional[Callable[[TensorDictBase, PolicyVersions, int], None]] = None,
    log: Optional[Callable[[str], None]] = None,
) -> History:
    """IMPALA's learner over ``collector``'s batches: per batch, :func:`vtrace` then one
    Adam step on :func:`make_loss`, then the new weights pushed to every node and kept
    in a :class:`PolicyVersions` under the version the push returned. ``actor`` must be
    the collector's, unchanged since it was built (it is version 0).
    ``on_batch(batch, versions, learner_version)`` is called on each batch before the
    learner reads it (the tests check the batches there)."""
    loss_module = make_loss(task, actor, critic)
    optim = torch.optim.Adam(loss_module.parameters(), lr=task.lr)
    versions = PolicyVersions(actor, collector.nodes)
    learner_version = 0
    returns = EpisodeReturns()
    history = History()
    frames = 0
    waited = 0.0
    start = time.perf_counter()
    batches = iter(collector)
    while frames < total_frames:
        t0 = time.perf_counter()
        data = next(batches, None)
        waited += time.perf_counter() - t0
        if data is None:
            break
        versions.seen(data)
        if on_batch is not None:
            on_batch(data, versions, learner_version)
        frames += data.numel()
        returns.add(data)
        lag = learner_version - data["policy_version"]
        stats = vtrace(task, data, actor, critic)
        loss = loss_module(data.reshape(-1))
        total = loss["loss_objective"] + loss["loss_critic"] + loss.get("loss_entropy", torch.zeros(()))
        optim.zero_grad()
        total.backward()
        nn.utils.clip_grad_norm_(loss_module.parameters(), task.max_grad_norm)
        optim.step()
        learner_version = collector.update_policy_weights_()
        versions.add(learner_version, actor)
        now = time.perf_counter() - start
        mean = returns.mean_last(20)
        history.frames.append(frames)
        history.returns.append(mean)
        history.wall.append(now)
        history.waited.append(waited)
        history.lag.append(lag.double().mean().item())
        history.max_lag.append(int(lag.max()))
        history.versions.append(data["policy_version"].unique().tolist())
        history.rho.append(stats["rho"])
        history.clipped.append(stats["clipped"])
        if log is not None:
            shown = "-" if mean is None else f"{mean:8.1f}"
            log(
                f"frames {frames:8d}  return(last 20) {shown}  lag {history.lag[-1]:4.1f} (max {history.max_lag[-1]:2d})"
                f"  rho {stats['rho']:5.3f}  wall {now:6.1f}s  waiting {100 * waited / now:4.1f}%"
            )
        if mean is not None and mean >= task.threshold and history.solved_at is None:
            history.solved_at, history.solved_wall, history.solved_waited = frames, now, waited
            if stop_at_threshold:
                break
    return history


def main() -> None:
    """The command line: one run on ``--env``, printing a line per batch."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="CartPole-v1", choices=sorted(TASKS))
    p.add_argument("--launcher", default="local", choices=("local", "process"), help="rollout's launcher")
    p.add_argument("--python-nodes", action="store_true",
                   help="the process launcher starts Python nodes (python/node, onnxruntime) instead of Rust ones")
    p.add_argument("--frames", type=int, default=None, help="frame budget (default: the task's, 1M CartPole, 2M Pendulum)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--envs-per-node", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-at-threshold", action="store_true")
    p.add_argument("--max-policy-lag", type=int, default=None, help="passed to the collector when given")
    p.add_argument("--prefetch", type=int, default=None, help="passed to the collector when given")
    args = p.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    task = TASKS[args.env]
    frames = args.frames or task.frames
    actor, critic = make_actor_critic(task)
    launcher, node_command = args.launcher, None
    if args.python_nodes:
        launcher, node_command = "process", [sys.executable, "-m", "rollout_node"]
    collector = make_collector(
        task, actor, frames, args.nodes, args.envs_per_node, args.seed, launcher, node_command,
        max_policy_lag=args.max_policy_lag, prefetch=args.prefetch,
    )
    try:
        h = train(task, collector, actor, critic, frames, stop_at_threshold=args.stop_at_threshold, log=print)
    finally:
        collector.shutdown()
    if h.solved_at is not None:
        print(f"reached {task.threshold} at {h.solved_at} frames, {h.solved_wall:.1f}s ({100 * h.solved_waited / h.solved_wall:.1f}% waiting)")
    else:
        print(f"did not reach {task.threshold} in {h.frames[-1] if h.frames else 0} frames (best {h.best:.1f})")


if __name__ == "__main__":
    main()
