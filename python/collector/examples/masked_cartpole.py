"""CartPole-v1 with its velocities masked, registered with gymnasium as
``MaskedCartPole-v1`` when this module is imported.

The observation is the cart's position and the pole's angle only (``f32 [2]``): a policy
must remember the previous frames to tell where the pole is going, which a feed-forward
actor cannot. Python nodes serve it when they import this module
(``python -m rollout_node --import masked_cartpole``, with this directory on
``PYTHONPATH``); it needs gymnasium only.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

ENV_ID = "MaskedCartPole-v1"
_KEEP = [0, 2]  # x, theta; x_dot and theta_dot are masked


class MaskVelocity(gym.ObservationWrapper):
    """Keeps the position entries of CartPole's observation."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[_KEEP], space.high[_KEEP], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[_KEEP]


def make(**kwargs) -> gym.Env:
    return MaskVelocity(CartPoleEnv(**kwargs))


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=make, max_episode_steps=500, reward_threshold=475.0)
