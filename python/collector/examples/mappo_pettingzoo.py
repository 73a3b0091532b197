"""MAPPO (or IPPO) on PettingZoo's ``simple_spread_v3`` (MPE, package ``mpe2``), the
collector picked by one flag: torchrl's ``Collector`` or rollout's ``DistributedCollector``.

The learner is torchrl's multi-agent PPO tutorial (``tutorials/sphinx-tutorials/
multiagent_ppo.py``) on torchrl's ``PettingZooWrapper``:

- the env: ``PettingZooWrapper(mpe2.simple_spread_v3.parallel_env(N=3, max_cycles=25,
  continuous_actions=False))``: one group ``"agent"`` of 3 agents, observations
  ``("agent", "observation")`` ``[3, 18]``, categorical actions ``("agent", "action")``
  ``[3]`` over 5 moves, rewards ``("agent", "reward")`` ``[3, 1]``, per-agent
  ``("agent", "done" / "terminated" / "truncated")`` ``[3, 1]`` next to the env's own
  ``done`` / ``terminated`` / ``truncated`` ``[1]``. An episode is 25 steps (it ends by
  truncation, all agents at once); a frame is one step of the env (3 agent-steps);
- the actor: one ``MultiAgentMLP`` (18 -> 5 logits, 64-64 tanh, ``centralised=False``,
  ``share_params=True``) in a ``TensorDictModule`` writing ``("agent", "logits")``, in a
  ``ProbabilisticActor`` sampling a ``Categorical`` and recording the action's
  log-prob ``("agent", "action_log_prob")`` ``[3]`` (torchrl 0.14's default key);
- the critic: a ``MultiAgentMLP`` (18 -> 1) writing ``("agent", "state_value")``;
  ``centralised=True`` (MAPPO: each agent's value reads the 3 agents' observations,
  54 inputs) or, with ``--ippo``, ``centralised=False`` (IPPO: its own 18);
- ``ClipPPOLoss`` with the tutorial's ``set_keys``: reward and action the env's keys
  (``("agent", "reward")``, ``("agent", "action")``), ``sample_log_prob=("agent",
  "action_log_prob")``, ``value=("agent", "state_value")``, ``done=("agent", "done")``,
  ``terminated=("agent", "terminated")``; advantages not normalised (the tutorial's
  choice: not across the agent dimension); its ``GAE`` estimator (``gamma``,
  ``lmbda``) run once per batch on the batch (time is its last batch dimension). The
  tutorial copies the env's ``("next", "done")`` over each agent's; the wrapper already
  writes per-agent flags, equal to the env's here (all agents end together), so they are
  read as they are;
- per batch, ``--epochs`` passes over the batch in minibatches of ``--minibatch`` frames
  (a ``ReplayBuffer`` sampling without replacement), Adam, gradients clipped at norm
  ``--max-grad-norm``; then ``collector.update_policy_weights_()``.

:func:`make_collector` is the only place the two runs differ:

- ``--collector torchrl``: ``torchrl.collectors.Collector(env, actor, ...)``, one env in
  this process, batches ``[frames_per_batch]``, always collected with the latest weights;
- ``--collector rollout``: ``rollout.DistributedCollector(env, actor, ...)``, the same
  wrapper (rollout's nodes make the PettingZoo env from it) over ``--nodes`` nodes of
  ``--envs-per-node`` envs, ``sync=True`` so that, like torchrl's collector, every batch
  is collected with the weights pushed after the previous one (``[nodes, envs, T]``).
  ``--nodes`` and ``--envs-per-node`` are rollout's only.

    python python/collector/examples/mappo_pettingzoo.py --collector torchrl
    python python/collector/examples/mappo_pettingzoo.py --collector rollout
    python python/collector/examples/mappo_pettingzoo.py --collector torchrl --ippo

The defaults (:class:`Config`): 6,000-frame batches (240 episodes), 10 epochs (the
tutorial's 30) of 400-frame minibatches, Adam 3e-4, gamma 0.99, lambda 0.9, clip 0.2,
entropy bonus 1e-4, gradient norm 1.

Each iteration prints the frames so far, the mean episode return of the batch, the
seconds since the first batch was asked for and the share of them spent waiting for
batches, and means over its minibatches of what the loss reports (:data:`STATS`). An
episode's return is the sum over its 25 steps of the mean of the 3 agents' rewards
(simple_spread gives the agents the same reward unless they collide); an episode is counted in the batch its last step is in
(its earlier steps may be in the batch before: sums are kept per
``("collector", "traj_ids")`` across batches), and the batch's mean return is the mean
over the episodes that ended in it. :func:`train` returns the same as a :class:`History`.

Measured (2-core machine shared with other work, load 4 to 8; the defaults, 10
iterations = 60,000 frames = 2,400 episodes, seeds 0-4 through rollout and 0-2 through
torchrl): uniformly random play scores -26.5 to -27.3 (episode standard deviation about
8; simple_spread's default ``local_ratio=0.5`` weighs the shared distance term and each
agent's collision term by half); the first iteration -25.9 to -28.2, the mean of the
last two -22.1 to -24.8, a gain of +3.0 to +5.0 through either collector (the figures
per run are in tests/test_mappo.py). An iteration took about 5 s through rollout (one
Python node of 4 envs, collection in the node's process) and 11 s (load 3) to 18 s
(load 5 to 8) through torchrl's ``Collector`` (``PettingZooWrapper`` stepped in this
process, about 600 frames a second); learning on a batch 1 to 2 s. The critic explains
next to nothing of the targets over these 10 iterations (explained variance about 0),
likely because truncated episodes bootstrap, so the targets drift towards ``r / (1 -
gamma)`` (about -100) while the Huber loss moves the critic by bounded steps
(``--critic-loss l2 --gamma 0.9`` gained +4.2 and +4.4 on seeds 0 and 1 through
rollout, against the defaults' +3.9 and +3.0).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings
from typing import Callable, Dict, List, Optional

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.modules import MultiAgentMLP, ProbabilisticActor
from torchrl.objectives import ClipPPOLoss, ValueEstimators

COLLECTORS = ("torchrl", "rollout")
N_AGENTS = 3
OBS_DIM = 18
N_ACTIONS = 5
MAX_CYCLES = 25
#: What ``ClipPPOLoss`` reports that each iteration prints (means over its minibatches):
#: the policy's entropy, the share of clipped ratios, the approximate KL to the batch's
#: policy, the critic's loss and its explained variance.
STATS = ("entropy", "clip_fraction", "kl_approx", "loss_critic", "explained_variance")


@dataclasses.dataclass
class Config:
    """The run's settings (the command line's defaults). ``frames_per_batch`` and
    ``minibatch`` count env steps (frames), each with the 3 agents' steps."""

    frames_per_batch: int = 6000
    iterations: int = 10
    epochs: int = 10
    minibatch: int = 400
    lr: float = 3e-4
    gamma: float = 0.99
    lmbda: float = 0.9
    clip_epsilon: float = 0.2
    entropy_coeff: float = 1e-4
    max_grad_norm: float = 1.0
    critic_loss: str = "smooth_l1"
    ippo: bool = False
    use_mask: bool = False
    collector: str = "torchrl"
    nodes: int = 1
    envs_per_node: int = 4
    seed: int = 0

    @property
    def total_frames(self) -> int:
        return self.frames_per_batch * self.iterations


def make_env(seed: Optional[int] = None, use_mask: bool = False):
    """torchrl's ``PettingZooWrapper`` around ``simple_spread_v3``'s parallel env (3
    agents, 25 steps, discrete actions). ``seed`` goes to the wrapper, which resets the
    PettingZoo env with it once (torchrl's collector's ``set_seed`` would leave its
    first frame from the unseeded reset)."""
    from mpe2 import simple_spread_v3
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper

    penv = simple_spread_v3.parallel_env(N=N_AGENTS, max_cycles=MAX_CYCLES, continuous_actions=False)
    return PettingZooWrapper(env=penv, use_mask=use_mask, seed=seed)


def make_actor_critic(ippo: bool = False):
    """The tutorial's policy (shared-parameter decentralised ``MultiAgentMLP`` to
    ``Categorical`` logits) and critic (``centralised=not ippo``), 64-64 tanh."""
    policy_net = MultiAgentMLP(
        n_agent_inputs=OBS_DIM, n_agent_outputs=N_ACTIONS, n_agents=N_AGENTS, centralised=False, share_params=True,
        depth=2, num_cells=64, activation_class=nn.Tanh,
    )
    actor = ProbabilisticActor(
        TensorDictModule(policy_net, in_keys=[("agent", "observation")], out_keys=[("agent", "logits")]),
        in_keys=[("agent", "logits")],
        out_keys=[("agent", "action")],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    critic_net = MultiAgentMLP(
        n_agent_inputs=OBS_DIM, n_agent_outputs=1, n_agents=N_AGENTS, centralised=not ippo, share_params=True,
        depth=2, num_cells=64, activation_class=nn.Tanh,
    )
    critic = TensorDictModule(critic_net, in_keys=[("agent", "observation")], out_keys=[("agent", "state_value")])
    return actor, critic


def make_collector(env, actor, args):
    """The one place the two runs differ: torchrl's ``Collector`` or rollout's
    ``DistributedCollector`` on the same env and actor. ``args`` needs ``collector``,
    ``frames_per_batch``, ``total_frames``, ``nodes``, ``envs_per_node`` and ``seed``."""
    if args.collector == "torchrl":
        from torchrl.collectors import Collector

        return Collector(
            env, actor, frames_per_batch=args.frames_per_batch, total_frames=args.total_frames,
            auto_register_policy_transforms=False,
        )
    if args.collector == "rollout":
        import rollout

        return rollout.DistributedCollector(
            env, actor, frames_per_batch=args.frames_per_batch, total_frames=args.total_frames,
            nodes=args.nodes, envs_per_node=args.envs_per_node, seed=args.seed, sync=True,
        )
    raise ValueError(f"--collector: one of {COLLECTORS}, got {args.collector!r}")


def make_loss(actor, critic, cfg: Config) -> ClipPPOLoss:
    """``ClipPPOLoss`` with the tutorial's keys and its ``GAE`` value estimator."""
    loss = ClipPPOLoss(
        actor_network=actor, critic_network=critic, clip_epsilon=cfg.clip_epsilon, entropy_coeff=cfg.entropy_coeff,
        normalize_advantage=False, loss_critic_type=cfg.critic_loss,
    )
    loss.set_keys(
        reward=("agent", "reward"), action=("agent", "action"), sample_log_prob=("agent", "action_log_prob"),
        value=("agent", "state_value"), done=("agent", "done"), terminated=("agent", "terminated"),
    )
    loss.make_value_estimator(ValueEstimators.GAE, gamma=cfg.gamma, lmbda=cfg.lmbda)
    return loss


def advantages(loss: ClipPPOLoss, td: TensorDictBase) -> TensorDictBase:
    """GAE on a batch (``advantage`` and ``value_target`` ``[..., 3, 1]``), as the tutorial
    calls it: the loss's critic parameters, no gradient."""
    with torch.no_grad():
        loss.value_estimator(td, params=loss.critic_network_params, target_params=loss.target_critic_network_params)
    return td


class EpisodeReturns:
    """Episode returns (the sum over an episode of the mean agent reward), summed per
    ``("collector", "traj_ids")`` across batches; :meth:`add` gives those of the episodes
    that ended in the batch."""

    def __init__(self) -> None:
        self.partial: Dict[int, float] = {}

    def add(self, td: TensorDictBase) -> List[float]:
        ids = td["collector", "traj_ids"].reshape(-1)
        reward = td["next", "agent", "reward"].mean(dim=(-2, -1)).reshape(-1).double()
        done = td["next", "done"].reshape(-1)
        uniq, inverse = ids.unique(return_inverse=True)
        sums = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inverse, reward)
        ended = set(ids[done].tolist())
        finished = []
        for i, s in zip(uniq.tolist(), sums.tolist()):
            total = self.partial.pop(i, 0.0) + s
            if i in ended:
                finished.append(total)
            else:
                self.partial[i] = total
        return finished


@dataclasses.dataclass
class History:
    """Per iteration: frames so far, mean return of the episodes that ended in the
    batch (None if none did), their number, seconds since the first batch was asked
    for, of which waiting for batches; the means over its minibatches of what the loss
    reports (:data:`STATS`)."""

    frames: List[int] = dataclasses.field(default_factory=list)
    returns: List[Optional[float]] = dataclasses.field(default_factory=list)
    episodes: List[int] = dataclasses.field(default_factory=list)
    wall: List[float] = dataclasses.field(default_factory=list)
    waited: List[float] = dataclasses.field(default_factory=list)
    stats: List[Dict[str, float]] = dataclasses.field(default_factory=list)


def train(
    collector,
    actor,
    critic,
    cfg: Config,
    on_batch: Optional[Callable[[TensorDictBase, ClipPPOLoss], None]] = None,
    log: Optional[Callable[[str], None]] = None,
) -> History:
    """The tutorial's loop over ``collector``'s batches (at most ``cfg.total_frames``
    frames): GAE, ``cfg.epochs`` passes of minibatches, Adam, then the weights pushed.
    ``on_batch(batch, loss)`` is called on each batch before the learner reads it."""
    loss_module = make_loss(actor, critic, cfg)
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr)
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(cfg.frames_per_batch), sampler=SamplerWithoutReplacement(), batch_size=cfg.minibatch
    )
    returns = EpisodeReturns()
    history = History()
    frames, waited = 0, 0.0
    start = time.perf_counter()
    batches = iter(collector)
    while frames < cfg.total_frames:
        t0 = time.perf_counter()
        data = next(batches, None)
        waited += time.perf_counter() - t0
        if data is None:
            break
        if on_batch is not None:
            on_batch(data, loss_module)
        frames += data.numel()
        ended = returns.add(data)
        advantages(loss_module, data)
        buffer.extend(data.reshape(-1))
        stats = []
        for _ in range(cfg.epochs):
            for mb in buffer:
                loss = loss_module(mb)
                total = loss["loss_objective"] + loss["loss_critic"] + loss["loss_entropy"]
                stats.append([loss[k].detach().mean().item() for k in STATS])
                optim.zero_grad()
                total.backward()
                nn.utils.clip_grad_norm_(loss_module.parameters(), cfg.max_grad_norm)
                optim.step()
        collector.update_policy_weights_()
        now = time.perf_counter() - start
        mean = sum(ended) / len(ended) if ended else None
        history.frames.append(frames)
        history.returns.append(mean)
        history.episodes.append(len(ended))
        history.wall.append(now)
        history.waited.append(waited)
        history.stats.append(dict(zip(STATS, torch.tensor(stats).mean(0).tolist())))
        if log is not None:
            shown = "-" if mean is None else f"{mean:8.2f}"
            st = history.stats[-1]
            log(
                f"frames {frames:8d}  return {shown} ({len(ended)} episodes)  wall {now:6.1f}s  waiting {100 * waited / now:4.1f}%"
                f"  entropy {st['entropy']:.3f}  clip {st['clip_fraction']:.3f}  kl {st['kl_approx']:.4f}"
                f"  critic {st['loss_critic']:.3f}  ev {st['explained_variance']:.2f}"
            )
    return history


def run(cfg: Config, log: Optional[Callable[[str], None]] = None, on_batch=None) -> History:
    """One run of ``cfg``: env, actor and critic seeded by ``cfg.seed``, the collector of
    ``cfg.collector``, shut down at the end."""
    torch.manual_seed(cfg.seed)
    env = make_env(seed=cfg.seed, use_mask=cfg.use_mask)
    actor, critic = make_actor_critic(cfg.ippo)
    collector = make_collector(env, actor, cfg)
    try:
        return train(collector, actor, critic, cfg, on_batch=on_batch, log=log)
    finally:
        collector.shutdown()


def main() -> None:
    """The command line: one run, a line per iteration."""
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--collector", default=d.collector, choices=COLLECTORS)
    p.add_argument("--ippo", action="store_true", help="decentralised critic (IPPO) instead of MAPPO's centralised one")
    p.add_argument("--use-mask", action="store_true", help="PettingZooWrapper(use_mask=True): batches carry ('agent', 'mask')")
    p.add_argument("--frames-per-batch", type=int, default=d.frames_per_batch)
    p.add_argument("--iterations", type=int, default=d.iterations)
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--minibatch", type=int, default=d.minibatch)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--gamma", type=float, default=d.gamma)
    p.add_argument("--lmbda", type=float, default=d.lmbda)
    p.add_argument("--entropy-coeff", type=float, default=d.entropy_coeff)
    p.add_argument("--critic-loss", default=d.critic_loss, choices=("smooth_l1", "l2"))
    p.add_argument("--nodes", type=int, default=d.nodes, help="rollout: nodes")
    p.add_argument("--envs-per-node", type=int, default=d.envs_per_node, help="rollout: envs per node")
    p.add_argument("--seed", type=int, default=d.seed)
    a = p.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    cfg = Config(
        frames_per_batch=a.frames_per_batch, iterations=a.iterations, epochs=a.epochs, minibatch=a.minibatch, lr=a.lr,
        gamma=a.gamma, lmbda=a.lmbda, entropy_coeff=a.entropy_coeff, critic_loss=a.critic_loss, ippo=a.ippo, use_mask=a.use_mask,
        collector=a.collector, nodes=a.nodes, envs_per_node=a.envs_per_node, seed=a.seed,
    )
    h = run(cfg, log=print)
    first, last = h.returns[0], h.returns[-1]
    if first is not None and last is not None:
        print(f"return {first:.2f} -> {last:.2f} in {h.frames[-1]} frames, {h.wall[-1]:.1f}s")


if __name__ == "__main__":
    main()
