"""torchrl's PPO with an LSTM actor on CartPole-v1 with its velocities masked, fed by
rollout's collector.

The env (``MaskedCartPole-v1``, :mod:`masked_cartpole`) shows the cart's position and
the pole's angle only, so the policy has to remember. The actor is torchrl's: an
``LSTMModule`` on the observation, an MLP to the logits, a ``OneHotCategorical``
``ProbabilisticActor``; the critic is a feed-forward ``ValueOperator`` on the
observation. The nodes run the actor one frame at a time and keep its state per env;
each batch (``[envs, T]``) carries ``is_init``, ``recurrent_state_h``/``_c`` and their
``("next", ...)``, and the learner runs ``ClipPPOLoss`` over the batch's time axis in
torchrl's recurrent mode (``set_recurrent_mode(True)``: the LSTM from each row's
recorded first state, split at ``is_init``), minibatches being whole env rows.

(A critic on the actor's own LSTM output, the LSTM shared, did not learn in this setup:
about 22 frames per episode after 80,000 frames, the initial policy's.)

The env needs Python nodes (``python/node``): the collector starts them with
``--import masked_cartpole`` and this directory on ``PYTHONPATH``.

    python python/collector/examples/ppo_lstm_torchrl.py --frames 100000

Each line is one batch: frames so far, the mean length of the last 20 episodes, the
seconds so far. :func:`train` returns the episodes' lengths in order.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Callable, List, Optional

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import LSTMModule, OneHotCategorical, ProbabilisticActor, ValueOperator, set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import masked_cartpole
import rollout

HERE = os.path.dirname(os.path.abspath(__file__))


def make_actor_critic(hidden: int = 64):
    """The actor (LSTM, MLP, ``OneHotCategorical``) and a feed-forward critic."""
    lstm = LSTMModule(input_size=2, hidden_size=hidden, in_key="observation", out_key="embed")
    actor = ProbabilisticActor(
        TensorDictSequential(
            lstm, TensorDictModule(nn.Sequential(nn.Linear(hidden, 64), nn.ReLU(), nn.Linear(64, 2)), in_keys=["embed"], out_keys=["logits"])
        ),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    critic = ValueOperator(nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 1)), in_keys=["observation"])
    return actor, critic


def make_collector(actor, frames_per_batch: int, total_frames: int, envs: int, seed: int):
    """rollout's collector on Python nodes that import :mod:`masked_cartpole`."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if HERE not in paths:  # the nodes (child processes) import masked_cartpole from here
        os.environ["PYTHONPATH"] = os.pathsep.join([HERE] + paths)
    return rollout.DistributedCollector(
        masked_cartpole.ENV_ID, actor, frames_per_batch=frames_per_batch, total_frames=total_frames,
        envs_per_node=envs, seed=seed, launcher="process",
        node_command=[sys.executable, "-m", "rollout_node", "--import", "masked_cartpole"],
    )


def episode_lengths(td) -> List[int]:
    """Lengths of the episodes that end in ``td`` (counted from ``step_count``)."""
    done = td["next", "done"].squeeze(-1)
    return [int(n) + 1 for n in td["step_count"].squeeze(-1)[done].tolist()]


def train(
    frames: int = 100_000,
    seed: int = 0,
    envs: int = 8,
    steps: int = 32,
    epochs: int = 10,
    rows_per_minibatch: int = 8,
    lr: float = 3e-3,
    log: Optional[Callable[[str], None]] = None,
) -> List[int]:
    """PPO over ``frames`` frames, batches of ``envs`` rows of ``steps`` frames each;
    returns the lengths of the finished episodes in order."""
    torch.manual_seed(seed)
    actor, critic = make_actor_critic()
    advantage = GAE(gamma=0.98, lmbda=0.8, value_network=critic, average_gae=False)
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_bonus=False, critic_coeff=0.5, loss_critic_type="smooth_l1", normalize_advantage=True)
    optim = torch.optim.Adam(loss_module.parameters(), lr=lr)
    lengths: List[int] = []
    start = time.perf_counter()
    collector = make_collector(actor, envs * steps, frames, envs, seed)
    try:
        done_frames = 0
        for data in collector:
            done_frames += data.numel()
            lengths += episode_lengths(data)
            with torch.no_grad():
                advantage(data)  # the critic is feed-forward: its values once per batch
            with set_recurrent_mode(True):  # the LSTM over each row's time axis, split at is_init
                for _ in range(epochs):
                    for rows in torch.randperm(data.shape[0]).split(rows_per_minibatch):
                        loss = loss_module(data[rows])
                        optim.zero_grad()
                        (loss["loss_objective"] + loss["loss_critic"]).backward()
                        nn.utils.clip_grad_norm_(loss_module.parameters(), 1.0)
                        optim.step()
            collector.update_policy_weights_()
            if log is not None:
                last = lengths[-20:]
                mean = f"{sum(last) / len(last):6.1f}" if len(last) == 20 else "     -"
                log(f"frames {done_frames:7d}  length(last 20) {mean}  wall {time.perf_counter() - start:6.1f}s")
    finally:
        collector.shutdown()
    return lengths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--envs", type=int, default=8)
    args = p.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    lengths = train(args.frames, args.seed, args.envs, log=print)
    last = lengths[-20:]
    print(f"mean length of the last 20 episodes: {sum(last) / max(len(last), 1):.1f}")


if __name__ == "__main__":
    main()
