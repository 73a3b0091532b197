"""A user env registered by a module of one's own (``--import flaky_env``): CartPole that
raises on its ``fail_at``-th step of its life, once per process per env index."""

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

FAILED = set()
COUNT = [0]


class FlakyCartPole(CartPoleEnv):
    """CartPole whose first incarnation (of all made in this process) raises at step ``fail_at``."""

    def __init__(self, fail_at=5, **kwargs):
        super().__init__(**kwargs)
        COUNT[0] += 1
        self.me = COUNT[0]
        self.fail_at = fail_at
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.me == 1 and self.steps == self.fail_at:
            raise RuntimeError("flaky env: step failed on purpose")
        return super().step(action)


gym.register(id="FlakyCartPole-v0", entry_point=FlakyCartPole, max_episode_steps=500)
