"""A user env (``--import marker_env``) that says when it is being stepped: CartPole that
creates the file ``marker`` at its ``at``-th step, so a test can act *while* a batch is
being collected (the file is the event it waits for) instead of guessing with a delay."""

import os

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class MarkerCartPole(CartPoleEnv):
    """CartPole that creates ``marker`` (a path) when its ``at``-th step of its life runs."""

    def __init__(self, marker="", at=1, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker
        self.at = at
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.marker and self.steps == self.at:
            with open(self.marker, "a"):
                pass
        return super().step(action)


gym.register(id="MarkerCartPole-v0", entry_point=MarkerCartPole, max_episode_steps=500)
