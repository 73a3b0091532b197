"""REINFORCE on CartPole-v1 with NumPy only, the collector doing the env steps.

The nodes run rollout's `linear` policy (logits = W obs + b, actions sampled
from softmax); this learner computes the policy gradient of those same logits
from each batch and pushes W and b back with `update_policy_weights_`.

    python python/collector/examples/pg_cartpole.py [iterations]

`train()` returns the mean episode length of every batch, which the test checks
goes up.
"""

from __future__ import annotations

import sys
from typing import List

import numpy as np

import rollout


def episode_length(done: np.ndarray) -> float:
    """Mean length of the episodes in a `[envs, T]` done mask (each batch starts
    fresh episodes; an episode cut by the batch end counts as its length so far)."""
    envs, t = done.shape
    ended = done.sum()
    # Every env contributes its ended episodes plus one unfinished one unless its last step ended.
    unfinished = (~done[:, -1]).sum()
    return envs * t / max(ended + unfinished, 1)


def returns_to_go(reward: np.ndarray, done: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted returns within each episode, `[envs, T]`."""
    out = np.zeros_like(reward)
    acc = np.zeros(reward.shape[0], dtype=reward.dtype)
    for t in range(reward.shape[1] - 1, -1, -1):
        acc = reward[:, t] + gamma * acc * (~done[:, t])
        out[:, t] = acc
    return out


def train(iterations: int = 40, seed: int = 0, lr: float = 0.5, verbose: bool = False) -> List[float]:
    rng = np.random.default_rng(seed)
    weight = rng.uniform(-0.1, 0.1, size=(2, 4)).astype(np.float32)
    bias = np.zeros(2, dtype=np.float32)
    lengths = []
    with rollout.DistributedCollector(
        "CartPole-v1",
        "linear",
        frames_per_batch=8 * 250,
        total_frames=iterations * 8 * 250,
        envs_per_node=8,
        sync=True,  # on-policy: each batch is collected with the weights just pushed
        reset_at_each_iter=True,
        update_after_each_batch=True,
        seed=seed,
    ) as collector:
        collector.update_policy_weights_({"weight": weight, "bias": bias})
        for batch in collector:
            obs = batch["observation"].reshape(-1, 250, 4)
            action = batch["action"].reshape(-1, 250)
            reward = batch["next", "reward"].reshape(-1, 250)
            done = batch["next", "done"].reshape(-1, 250)
            lengths.append(episode_length(done))
            g = returns_to_go(reward, done, 0.99)
            adv = (g - g.mean()) / (g.std() + 1e-8)
            logits = obs @ weight.T + bias
            logits -= logits.max(axis=-1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=-1, keepdims=True)
            onehot = np.eye(2, dtype=np.float32)[action]
            dlogits = (onehot - p) * adv[..., None]  # d log pi(a|s) / d logits, times the advantage
            n = action.size
            weight += lr * np.einsum("eta,etd->ad", dlogits, obs) / n * 10
            bias += lr * dlogits.sum(axis=(0, 1)) / n * 10
            collector.update_policy_weights_({"weight": weight, "bias": bias})
            if verbose:
                print(f"batch {batch.index:3d}  weights v{batch.weights_version:<3d}  mean episode length {lengths[-1]:6.1f}")
    return lengths


if __name__ == "__main__":
    train(int(sys.argv[1]) if len(sys.argv) > 1 else 40, verbose=True)
