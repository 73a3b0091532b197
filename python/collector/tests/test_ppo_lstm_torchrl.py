"""torchrl's PPO with an LSTM actor learns CartPole with its velocities masked through
rollout's collector on Python nodes (examples/ppo_lstm_torchrl.py): the mean length of
the last 20 episodes after 100,000 frames passes ``THRESHOLD``, which the same learner
with a feed-forward actor does not reach (seed 0: 42, its best 20 episodes 64; the LSTM
actor, seeds 0-2: 289, 165, 181; batches overlap learning, so a run's numbers vary)."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
from conftest import require_python_node

_MISSING = [m for m in ("torch", "tensordict", "torchrl", "onnx", "gymnasium") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)}: the torch extra and gymnasium")

FRAMES = 100_000
THRESHOLD = 100.0


def test_ppo_with_an_lstm_actor_learns_cartpole_without_velocities():
    require_python_node()
    import torch

    import ppo_lstm_torchrl

    warnings.filterwarnings("ignore", category=UserWarning)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the learner's small tensors: one thread is fastest on a shared machine
    try:
        lengths = ppo_lstm_torchrl.train(frames=FRAMES, seed=0)
    finally:
        torch.set_num_threads(threads)
    last = lengths[-20:]
    assert len(last) == 20 and sum(last) / 20 > THRESHOLD, lengths[-40:]
