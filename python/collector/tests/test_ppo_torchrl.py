"""torchrl's PPO learns CartPole through rollout's collector (examples/ppo_torchrl.py,
shortened), and the two checks it is judged by catch a broken collector.

The checks, on a sync run (every batch collected with the weights pushed after the
previous one): the log-probs the batch records are the actor's own (the approximate KL
``mean(logp_recorded - logp_actor)`` before the batch's first gradient step is ≈ 0 on
every batch: measured within 5e-9), and the mean return of the last 20 episodes after
16 batches of 2,048 frames passes ``THRESHOLD`` (seeds 0-4: 378 to 450).

A collector whose batches record zeroed log-probs fails the first (KL ≈ 0.69, the
entropy of the initial policy); its return is no proof of anything, since PPO's clipped
ratio still learns from positive advantages (seeds 0-4 after 16 batches: 141 to 443).
A collector that never gets the new weights fails both (KL ≈ 0.01-0.03 from the second
batch on; return about 20, the initial policy's).
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest

_MISSING = [m for m in ("torch", "tensordict", "torchrl", "onnx") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(_MISSING), reason=f"needs {', '.join(_MISSING)}: the torch extra (pip install ./python/collector[torch])"
)

BATCHES = 16
THRESHOLD = 250.0
KL_TOLERANCE = 1e-4


def run(batches: int, *, seed: int = 0, update_weights: bool = True, batch_hook=None):
    import torch

    import ppo_torchrl

    warnings.filterwarnings("ignore", category=UserWarning)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the learner's small tensors: one thread is fastest on a shared machine
    torch.manual_seed(seed)
    task = ppo_torchrl.TASKS["CartPole-v1"]
    frames = batches * task.frames_per_batch
    actor, critic = ppo_torchrl.make_actor_critic(task)
    collector = ppo_torchrl.make_collector("rollout", task, actor, frames, nodes=2, envs_per_node=4, seed=seed, sync=True)
    try:
        return ppo_torchrl.train(task, collector, actor, critic, frames, update_weights=update_weights, batch_hook=batch_hook)
    finally:
        collector.shutdown()
        torch.set_num_threads(threads)


def faults(history) -> list:
    """What shows a broken collector in ``history``: recorded log-probs that are not
    the actor's, and a return below the threshold."""
    found = []
    off = [(i, kl) for i, kl in enumerate(history.kl) if abs(kl) > KL_TOLERANCE]
    if off:
        found.append(f"log-probs: batch {off[0][0]} records KL {off[0][1]:.3g} from the actor's")
    final = history.returns[-1] if history.returns else None
    if final is None or final < THRESHOLD:
        found.append(f"return: {final} after {history.frames[-1] if history.frames else 0} frames, below {THRESHOLD}")
    return found


def zero_log_probs(td):
    import torch

    td["action_log_prob"] = torch.zeros_like(td["action_log_prob"])
    return td


def test_ppo_learns_cartpole_with_the_behaviour_policys_log_probs():
    history = run(BATCHES)
    assert faults(history) == [], f"returns {history.returns}, KL {history.kl}"


def test_zeroed_log_probs_are_caught_on_the_first_batch():
    history = run(1, batch_hook=zero_log_probs)
    assert any(f.startswith("log-probs: batch 0") for f in faults(history)), history.kl


def test_stale_weights_are_caught_by_the_log_probs_and_the_return():
    history = run(BATCHES, update_weights=False)
    found = faults(history)
    assert any(f.startswith("log-probs: batch 1") for f in found), history.kl
    assert any(f.startswith("return:") for f in found), history.returns
