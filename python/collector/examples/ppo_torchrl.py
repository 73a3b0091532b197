"""torchrl's PPO on CartPole-v1 or Pendulum-v1, with the collector picked by one flag.

The learner is torchrl's PPO as its own examples write it: a ``ProbabilisticActor``
(``OneHotCategorical`` over a 64-64 tanh MLP for CartPole, ``TanhNormal`` with a
``NormalParamExtractor`` for Pendulum), a ``ValueOperator`` critic, ``GAE``,
``ClipPPOLoss``, a replay buffer holding the batch sampled without replacement, and
Adam. Only :func:`make_collector` differs between the three collectors:

- ``torchrl``: torchrl's single-process ``Collector`` over one node's envs
  (``--envs-per-node`` ``GymEnv`` s in a ``SerialEnv``);
- ``torchrl-distributed``: torchrl's ``DistributedCollector`` (``launcher="mp"``),
  ``--nodes`` sub-collectors, each a ``Collector`` over ``--envs-per-node`` envs in
  a ``SerialEnv``;
- ``rollout``: ``rollout.DistributedCollector``, the same nodes and envs per node,
  the actor itself as its policy (``--launcher local`` or ``process``).

    python python/collector/examples/ppo_torchrl.py --env CartPole-v1 --collector rollout

Each batch prints the frames so far, the mean return of the last 20 episodes, the
seconds since the first batch was asked for and the share of them spent waiting for
batches. :func:`train` returns the same as a :class:`History`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional

import torch
from tensordict import TensorDictBase
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.modules import OneHotCategorical, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

COLLECTORS = ("torchrl", "torchrl-distributed", "rollout")


@dataclasses.dataclass
class Task:
    """What differs between the two envs: sizes, hyperparameters, the return to reach."""

    env: str
    obs_dim: int
    action_dim: int
    continuous: bool
    threshold: float
    frames_per_batch: int
    epochs: int
    minibatch: int
    lr: float
    gamma: float
    lmbda: float
    entropy_coeff: float
    critic_loss: str
    action_low: float = -1.0
    action_high: float = 1.0


TASKS: Dict[str, Task] = {
    "CartPole-v1": Task("CartPole-v1", 4, 2, False, 475.0, 2048, 10, 256, 1e-3, 0.99, 0.95, 0.0, "smooth_l1"),
    "Pendulum-v1": Task("Pendulum-v1", 3, 1, True, -200.0, 4096, 10, 256, 1e-3, 0.9, 0.95, 0.0, "l2", -2.0, 2.0),
}


def mlp(n_in: int, n_out: int) -> nn.Sequential:
    """The 64-64 tanh MLP torchrl's PPO examples use for actor and critic."""
    return nn.Sequential(nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_out))


def make_actor_critic(task: Task):
    """The actor (``ProbabilisticActor`` writing ``action_log_prob``) and the critic."""
    if task.continuous:
        net = nn.Sequential(mlp(task.obs_dim, 2 * task.action_dim), NormalParamExtractor())
        actor = ProbabilisticActor(
            TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
            in_keys=["loc", "scale"],
            distribution_class=TanhNormal,
            distribution_kwargs={"low": task.action_low, "high": task.action_high},
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
    kind: str, task: Task, actor, total_frames: int, nodes: int, envs_per_node: int, seed: int, launcher: str = "local", sync: bool = False,
    node_command: Optional[List[str]] = None,
):
    """The one place the three runs differ. ``sync=True`` (the distributed ones) makes
    every batch collected with the weights pushed after the previous one; the default
    overlaps collection with learning, and PPO's ratio uses the recorded log-probs."""
    if kind == "rollout":
        import rollout

        return rollout.DistributedCollector(
            task.env, actor, frames_per_batch=task.frames_per_batch, total_frames=total_frames,
            nodes=nodes, envs_per_node=envs_per_node, sync=sync, seed=seed, launcher=launcher,
            node_command=node_command,
        )
    env_fn = _GymEnvFn(task.env, envs_per_node)
    if kind == "torchrl":
        from torchrl.collectors import Collector

        c = Collector(env_fn, actor, frames_per_batch=task.frames_per_batch, total_frames=total_frames)  # always in step
        c.set_seed(seed)
        return c
    if kind == "torchrl-distributed":
        from torchrl.collectors.distributed import DistributedCollector

        return DistributedCollector(
            [env_fn] * nodes, actor, frames_per_batch=task.frames_per_batch, total_frames=total_frames,
            sync=sync, launcher="mp",
        )
    raise ValueError(f"--collector: one of {COLLECTORS}, got {kind!r}")


class _GymEnvFn:
    """A node's envs as torchrl makes them: ``GymEnv(env)``, or ``envs`` of them in a
    ``SerialEnv`` (one process stepping them in turn, as a rollout node does); a
    picklable callable, since torchrl's ``mp`` launcher pickles it."""

    def __init__(self, env: str, envs: int) -> None:
        self.env = env
        self.envs = envs

    def __call__(self):
        from torchrl.envs import GymEnv, SerialEnv

        if self.envs == 1:
            return GymEnv(self.env)
        return SerialEnv(self.envs, _GymEnvFn(self.env, 1))


class EpisodeReturns:
    """Returns of finished episodes, summed per ``("collector", "traj_ids")`` across batches."""

    def __init__(self) -> None:
        self.partial: Dict[int, float] = {}
        self.finished: List[float] = []

    def add(self, td: TensorDictBase) -> None:
        ids = td["collector", "traj_ids"].reshape(-1)
        reward = td["next", "reward"].reshape(-1).double()
        done = td["next", "done"].reshape(-1)
        uniq, inverse = ids.unique(return_inverse=True)
        sums = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inverse, reward)
        ended = set(ids[done].tolist())
        for i, s in zip(uniq.tolist(), sums.tolist()):
            total = self.partial.pop(i, 0.0) + s
            if i in ended:
                self.finished.append(total)
            else:
                self.partial[i] = total

    def mean_last(self, n: int = 20) -> Optional[float]:
        last = self.finished[-n:]
        return sum(last) / len(last) if len(last) == n else None


@dataclasses.dataclass
class History:
    """Per batch: frames so far, mean return of the last 20 episodes (None before 20),
    seconds since the first batch was asked for, of which waiting for batches; the
    approximate KL between the recorded log-probs and the actor's own before the
    batch's first gradient step; and when the threshold was first reached."""

    frames: List[int] = dataclasses.field(default_factory=list)
    returns: List[Optional[float]] = dataclasses.field(default_factory=list)
    wall: List[float] = dataclasses.field(default_factory=list)
    waited: List[float] = dataclasses.field(default_factory=list)
    kl: List[float] = dataclasses.field(default_factory=list)
    solved_at: Optional[int] = None
    solved_wall: Optional[float] = None
    solved_waited: Optional[float] = None

    @property
    def best(self) -> float:
        seen = [r for r in self.returns if r is not None]
        return max(seen) if seen else float("-inf")


def behaviour_kl(actor, td: TensorDictBase) -> float:
    """``mean(logp_recorded - logp_actor)`` over the batch (≈ 0 when the batch's
    log-probs are the actor's own): the ``kl_approx`` ClipPPOLoss reports, on the whole
    batch before any step."""
    with torch.no_grad():
        dist = actor.get_dist(td)
        lp = dist.log_prob(td["action"])
    return (td["action_log_prob"] - lp).mean().item()


def train(
    task: Task,
    collector,
    actor,
    critic,
    total_frames: int,
    stop_at_threshold: bool = False,
    update_weights: bool = True,
    batch_hook: Optional[Callable[[TensorDictBase], TensorDictBase]] = None,
    log: Optional[Callable[[str], None]] = None,
) -> History:
    """torchrl's PPO loop over ``collector``'s batches; ``batch_hook`` may change a batch
    before the learner sees it and ``update_weights=False`` never pushes weights (both
    to show what a broken collector does)."""
    advantage = GAE(gamma=task.gamma, lmbda=task.lmbda, value_network=critic, average_gae=False)
    loss_module = ClipPPOLoss(
        actor, critic, clip_epsilon=0.2, entropy_bonus=task.entropy_coeff > 0, entropy_coeff=task.entropy_coeff,
        critic_coeff=0.5, loss_critic_type=task.critic_loss, normalize_advantage=True,
    )
    optim = torch.optim.Adam(loss_module.parameters(), lr=task.lr)
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(task.frames_per_batch), sampler=SamplerWithoutReplacement(), batch_size=task.minibatch
    )
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
        if batch_hook is not None:
            data = batch_hook(data)
        frames += data.numel()
        returns.add(data)
        history.kl.append(behaviour_kl(actor, data))
        for _ in range(task.epochs):
            with torch.no_grad():
                advantage(data)
            buffer.extend(data.reshape(-1))
            for mb in buffer:
                loss = loss_module(mb)
                total = loss["loss_objective"] + loss["loss_critic"] + loss.get("loss_entropy", torch.zeros(()))
                optim.zero_grad()
                total.backward()
                nn.utils.clip_grad_norm_(loss_module.parameters(), 1.0)
                optim.step()
        if update_weights:
            collector.update_policy_weights_()
        now = time.perf_counter() - start
        mean = returns.mean_last(20)
        history.frames.append(frames)
        history.returns.append(mean)
        history.wall.append(now)
        history.waited.append(waited)
        if log is not None:
            shown = "-" if mean is None else f"{mean:8.1f}"
            log(f"frames {frames:7d}  return(last 20) {shown}  wall {now:6.1f}s  waiting {100 * waited / now:4.1f}%")
        if mean is not None and mean >= task.threshold and history.solved_at is None:
            history.solved_at, history.solved_wall, history.solved_waited = frames, now, waited
            if stop_at_threshold:
                break
    return history


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="CartPole-v1", choices=sorted(TASKS))
    p.add_argument("--collector", default="rollout", choices=COLLECTORS)
    p.add_argument("--launcher", default="local", choices=("local", "process"), help="rollout's launcher")
    p.add_argument("--python-nodes", action="store_true",
                   help="rollout's process launcher starts Python nodes (python/node, onnxruntime) instead of Rust ones")
    p.add_argument("--frames", type=int, default=None, help="frame budget (default: 300k CartPole, 1M Pendulum)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--envs-per-node", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-at-threshold", action="store_true")
    p.add_argument("--epochs", type=int, default=None, help="optimisation epochs per batch (default: the task's, 10)")
    args = p.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    task = TASKS[args.env]
    if args.epochs is not None:
        task = dataclasses.replace(task, epochs=args.epochs)
    frames = args.frames or (300_000 if not task.continuous else 1_000_000)
    actor, critic = make_actor_critic(task)
    launcher, node_command = args.launcher, None
    if args.python_nodes:
        launcher, node_command = "process", [sys.executable, "-m", "rollout_node"]
    collector = make_collector(
        args.collector, task, actor, frames, args.nodes, args.envs_per_node, args.seed, launcher, node_command=node_command
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
