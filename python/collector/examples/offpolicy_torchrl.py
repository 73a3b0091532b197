"""torchrl's off-policy learners, DQN on CartPole-v1, TD3, DDPG and SAC on Pendulum-v1, as
torchrl's examples write them, with rollout's collector in the one line that makes the collector.

Everything else is torchrl's: the env function (``TransformedEnv(GymEnv(...),
Compose(StepCounter(), RewardSum()))``, with ``InitTracker()`` for DDPG and SAC), the actor
and its exploration module (``QValueActor`` with ``EGreedyModule``; a deterministic actor with
``AdditiveGaussianModule``, or with ``OrnsteinUhlenbeckProcessModule`` for DDPG, whose noise
per env the nodes keep; SAC's ``ProbabilisticActor`` over a ``TanhNormal``, which the nodes
sample, needs none), the replay buffer, the loss (``DQNLoss``, ``TD3Loss``, ``DDPGLoss``,
``SACLoss``), the target network updates, the annealing (``module.step(frames)``) and
``update_policy_weights_()`` after each batch.

    python python/collector/examples/offpolicy_torchrl.py dqn --frames 20000
    python python/collector/examples/offpolicy_torchrl.py td3 --frames 20000
    python python/collector/examples/offpolicy_torchrl.py ddpg --frames 20000
    python python/collector/examples/offpolicy_torchrl.py sac --frames 20000

:func:`dqn` returns the length of each finished episode, :func:`td3`, :func:`ddpg` and
:func:`sac` its return, in order.
"""

from __future__ import annotations

import argparse
import warnings
from typing import List

import torch
from tensordict.nn import InteractionType, NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Bounded, LazyTensorStorage, OneHot, ReplayBuffer
from torchrl.envs import Compose, GymEnv, InitTracker, RewardSum, StepCounter, TransformedEnv
from torchrl.modules import (
    MLP,
    AdditiveGaussianModule,
    EGreedyModule,
    OrnsteinUhlenbeckProcessModule,
    ProbabilisticActor,
    QValueActor,
    TanhModule,
    TanhNormal,
    ValueOperator,
)
from torchrl.objectives import DDPGLoss, DQNLoss, SACLoss, SoftUpdate, TD3Loss

import rollout


def make_env(env_name: str, *transforms):
    return lambda: TransformedEnv(GymEnv(env_name), Compose(StepCounter(), *transforms, RewardSum()))


def make_collector(env_name: str, policy, frames_per_batch: int, total_frames: int, init_random_frames: int, seed: int, *transforms, **kw):
    # The one line a torchrl script changes: torchrl's collector takes the same arguments
    # (`kw`: rollout's own, such as the nodes to run on).
    return rollout.DistributedCollector(
        create_env_fn=[make_env(env_name, *transforms)],
        policy=policy,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        init_random_frames=init_random_frames,
        seed=seed,
        **kw,
    )


def finished(data, key) -> List[float]:
    """``key`` at the last frame of each episode that ends in ``data``."""
    done = data["next", "done"].squeeze(-1)
    return data[key][done].flatten().tolist()


def dqn(frames: int = 20_000, seed: int = 0, frames_per_batch: int = 200) -> List[float]:
    torch.manual_seed(seed)
    actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[64, 64]), in_keys=["observation"], spec=OneHot(2))
    greedy = EGreedyModule(spec=OneHot(2), eps_init=1.0, eps_end=0.05, annealing_num_steps=frames // 2)
    policy = TensorDictSequential(actor, greedy)
    loss = DQNLoss(value_network=actor, loss_function="l2", delay_value=True, action_space=OneHot(2))
    loss.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss, eps=0.99)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-3)
    buffer = ReplayBuffer(storage=LazyTensorStorage(10_000), batch_size=128)
    collector = make_collector("CartPole-v1", policy, frames_per_batch, frames, 1_000, seed)
    lengths: List[float] = []
    try:
        for data in collector:
            greedy.step(data.numel())
            buffer.extend(data.reshape(-1))
            lengths += [n + 1 for n in finished(data, "step_count")]
            if len(buffer) >= 1_000:
                for _ in range(frames_per_batch // 10):
                    step = loss(buffer.sample())["loss"]
                    optim.zero_grad()
                    step.backward()
                    optim.step()
                    target.step()
            collector.update_policy_weights_()
    finally:
        collector.shutdown()
    return lengths


def td3(frames: int = 4_000, seed: int = 0, frames_per_batch: int = 200, updates_per_batch: int = 20) -> List[float]:
    torch.manual_seed(seed)
    spec = Bounded(-2.0, 2.0, (1,))
    actor = TensorDictSequential(
        TensorDictModule(MLP(in_features=3, out_features=1, num_cells=[64, 64]), in_keys=["observation"], out_keys=["param"]),
        TanhModule(in_keys=["param"], out_keys=["action"], spec=spec),
    )
    qvalue = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[64, 64]), in_keys=["observation", "action"])
    noise = AdditiveGaussianModule(spec=spec, sigma_init=1.0, sigma_end=0.1, annealing_num_steps=frames)
    policy = TensorDictSequential(actor, noise)
    loss = TD3Loss(actor_network=actor, qvalue_network=qvalue, action_spec=spec, num_qvalue_nets=2)
    loss.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss, eps=0.995)
    optim = torch.optim.Adam(loss.parameters(), lr=3e-4)
    buffer = ReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=128)
    collector = make_collector("Pendulum-v1", policy, frames_per_batch, frames, 1_000, seed)
    returns: List[float] = []
    try:
        for data in collector:
            noise.step(data.numel())
            buffer.extend(data.reshape(-1))
            returns += finished(data, ("next", "episode_reward"))
            if len(buffer) >= 1_000:
                for _ in range(updates_per_batch):
                    out = loss(buffer.sample())
                    optim.zero_grad()
                    (out["loss_actor"] + out["loss_qvalue"]).backward()
                    optim.step()
                    target.step()
            collector.update_policy_weights_()
    finally:
        collector.shutdown()
    return returns


def ddpg(frames: int = 4_000, seed: int = 0, frames_per_batch: int = 200, updates_per_batch: int = 20, **collector_kw) -> List[float]:
    """torchrl's DDPG example (``make_ddpg_agent``): a tanh-bounded MLP actor, an MLP critic
    on (observation, action), Ornstein-Uhlenbeck noise whose ``eps`` anneals over the run,
    ``DDPGLoss`` with target networks for both."""
    torch.manual_seed(seed)
    spec = Bounded(-2.0, 2.0, (1,))
    actor = TensorDictSequential(
        TensorDictModule(MLP(in_features=3, out_features=1, num_cells=[64, 64]), in_keys=["observation"], out_keys=["param"]),
        TanhModule(in_keys=["param"], out_keys=["action"], spec=spec),
    )
    qvalue = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[64, 64]), in_keys=["observation", "action"])
    noise = OrnsteinUhlenbeckProcessModule(spec=spec, annealing_num_steps=frames)
    policy = TensorDictSequential(actor, noise)
    loss = DDPGLoss(actor_network=actor, value_network=qvalue, loss_function="l2", delay_actor=True, delay_value=True)
    loss.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss, eps=0.995)
    optim_actor = torch.optim.Adam(loss.actor_network_params.flatten_keys().values(), lr=1e-4)
    optim_critic = torch.optim.Adam(loss.value_network_params.flatten_keys().values(), lr=1e-3)
    buffer = ReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=128)
    # InitTracker: the module restarts its noise at each episode's first frame (`is_init`).
    collector = make_collector("Pendulum-v1", policy, frames_per_batch, frames, 1_000, seed, InitTracker(), **collector_kw)
    returns: List[float] = []
    try:
        for data in collector:
            noise.step(data.numel())
            buffer.extend(data.reshape(-1))
            returns += finished(data, ("next", "episode_reward"))
            if len(buffer) >= 1_000:
                for _ in range(updates_per_batch):
                    out = loss(buffer.sample())
                    # The actor's loss reads the critic's parameters detached: one backward
                    # gives each optimizer its own gradients.
                    optim_critic.zero_grad()
                    optim_actor.zero_grad()
                    (out["loss_value"] + out["loss_actor"]).backward()
                    optim_critic.step()
                    optim_actor.step()
                    target.step()
            collector.update_policy_weights_()
    finally:
        collector.shutdown()
    return returns


def make_sac_actor(spec: Bounded, num_cells=(256, 256)) -> ProbabilisticActor:
    """torchrl's SAC actor (``make_sac_agent``): an MLP whose two halves are the loc and
    the scale (``NormalParamExtractor``, a biased softplus bounded below by 0.1), a
    ``TanhNormal`` squashed into the action spec's bounds, sampled when it acts."""
    body = nn.Sequential(
        MLP(in_features=3, out_features=2 * spec.shape[-1], num_cells=list(num_cells)),
        NormalParamExtractor(scale_mapping="biased_softplus_1.0", scale_lb=0.1),
    )
    return ProbabilisticActor(
        TensorDictModule(body, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        spec=spec,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.space.low, "high": spec.space.high, "tanh_loc": False},
        default_interaction_type=InteractionType.RANDOM,
        # As torchrl's example: SACLoss samples its own actions (and their log-probs).
        return_log_prob=False,
    )


def make_sac_loss(actor: ProbabilisticActor, num_cells=(256, 256)):
    """torchrl's ``make_loss_module``: two Q-value nets on (action, observation), target
    copies of them only, the entropy coefficient learned from 1."""
    qvalue = ValueOperator(MLP(in_features=4, out_features=1, num_cells=list(num_cells)), in_keys=["action", "observation"])
    loss = SACLoss(
        actor_network=actor,
        qvalue_network=qvalue,
        num_qvalue_nets=2,
        loss_function="l2",
        delay_actor=False,
        delay_qvalue=True,
        alpha_init=1.0,
    )
    loss.make_value_estimator(gamma=0.99)
    return loss, SoftUpdate(loss, eps=0.995)


def sac(
    frames: int = 20_000,
    seed: int = 0,
    frames_per_batch: int = 200,
    updates_per_batch: int = 200,
    init_random_frames: int = 1_000,
    num_cells=(256, 256),
    **collector_kw,
) -> List[float]:
    """torchrl's SAC example on Pendulum: :func:`make_sac_actor`, :func:`make_sac_loss`,
    an optimizer each for the actor, the critics and alpha (lr 3e-4), batches of 256 from
    the replay buffer, one update per frame collected (``utd_ratio`` 1) once the
    ``init_random_frames`` of a random policy are in. The nodes sample the actor's
    ``TanhNormal`` themselves: there is no exploration module."""
    torch.manual_seed(seed)
    spec = Bounded(-2.0, 2.0, (1,))
    actor = make_sac_actor(spec, num_cells)
    loss, target = make_sac_loss(actor, num_cells)
    optim_actor = torch.optim.Adam(loss.actor_network_params.flatten_keys().values(), lr=3e-4)
    optim_critic = torch.optim.Adam(loss.qvalue_network_params.flatten_keys().values(), lr=3e-4)
    optim_alpha = torch.optim.Adam([loss.log_alpha], lr=3e-4)
    buffer = ReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=256)
    # torchrl's SAC env: InitTracker, StepCounter, RewardSum (its DoubleToFloat has nothing
    # to do on Pendulum, whose observations are float32).
    collector = make_collector("Pendulum-v1", actor, frames_per_batch, frames, init_random_frames, seed, InitTracker(), **collector_kw)
    returns: List[float] = []
    try:
        for data in collector:
            buffer.extend(data.reshape(-1))
            returns += finished(data, ("next", "episode_reward"))
            if len(buffer) >= init_random_frames:
                for _ in range(updates_per_batch):
                    out = loss(buffer.sample())
                    # Each loss reads the others' parameters detached: one backward gives
                    # each optimizer its own gradients.
                    optim_actor.zero_grad()
                    optim_critic.zero_grad()
                    optim_alpha.zero_grad()
                    (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
                    optim_actor.step()
                    optim_critic.step()
                    optim_alpha.step()
                    target.step()
            collector.update_policy_weights_()
    finally:
        collector.shutdown()
    return returns


def main() -> None:
    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("algo", choices=["dqn", "td3", "ddpg", "sac"])
    p.add_argument("--frames", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = {"dqn": dqn, "td3": td3, "ddpg": ddpg, "sac": sac}[a.algo](frames=a.frames, seed=a.seed)
    last = out[-20:]
    print(f"{len(out)} episodes; mean of the last {len(last)}: {sum(last) / max(1, len(last)):.1f}")


if __name__ == "__main__":
    main()
