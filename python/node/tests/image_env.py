"""A small env of uint8 image observations, registered with gymnasium (``--import
image_env``): ``TinyImage-v0``, 12x12 RGB frames (HWC, as Atari's) that depend on the
actions taken (3 choices), episodes of at most 20 steps."""

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class TinyImage(gym.Env):
    """A bright square that the actions move left, not at all, or right over noise."""

    def __init__(self):
        self.observation_space = spaces.Box(0, 255, (12, 12, 3), np.uint8)
        self.action_space = spaces.Discrete(3)

    def _obs(self):
        img = self.np_random.integers(0, 64, (12, 12, 3), dtype=np.uint8)
        img[4:8, self.x : self.x + 4] = 255
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = int(self.np_random.integers(0, 9))
        return self._obs(), {}

    def step(self, action):
        self.x = int(np.clip(self.x + int(action) - 1, 0, 8))
        return self._obs(), float(self.x == 4), False, False, {}


gym.register(id="TinyImage-v0", entry_point=TinyImage, max_episode_steps=20)
