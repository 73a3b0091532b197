"""Envs of every space the node collects, registered with gymnasium (``--import spaces_env``):

* ``DictSpaces-v0``: a dict observation (nested; f64, u8 and int32 boxes, a discrete value
  from -3, a multi-binary vector) and the action ``action`` names: ``multi_discrete``
  ([3, 2]), ``multi_binary`` (4) or ``discrete`` (3 choices from -1). Every observation
  depends on the actions taken and on the env's generator, episodes end at random.
* ``FlakyDictSpaces-v0``: ``DictSpaces-v0`` whose first instance made after ``COUNT[0] = -1``
  (of all made in this process) raises at its ``fail_at``-th step.
* ``TupleInDict-v0``: a dict observation whose ``foo`` is a Tuple, which no node collects.
"""

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ACTIONS = {
    "multi_discrete": spaces.MultiDiscrete([3, 2]),
    "multi_binary": spaces.MultiBinary(4),
    "discrete": spaces.Discrete(3, start=-1),
}


class DictSpaces(gym.Env):
    """Every observation and action kind the node supports, in one small env."""

    def __init__(self, action="multi_discrete"):
        self.observation_space = spaces.Dict({
            "pos": spaces.Box(-1.0, 1.0, (2,), np.float64),
            "count": spaces.Discrete(20, start=-3),
            "flags": spaces.MultiBinary(3),
            "inner": spaces.Dict({
                "img": spaces.Box(0, 255, (4, 4), np.uint8),
                "level": spaces.Box(-5, 5, (), np.int32),
            }),
        })
        self.action_space = ACTIONS[action]

    def _obs(self):
        return {
            "pos": self.pos.copy(),
            "count": self.count,
            "flags": self.flags.copy(),
            "inner": {"img": self.img.copy(), "level": np.array(self.level, np.int32)},
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        r = self.np_random
        self.pos = r.uniform(-1.0, 1.0, 2)
        self.count = -3
        self.flags = r.integers(0, 2, 3).astype(np.int8)
        self.img = r.integers(0, 256, (4, 4)).astype(np.uint8)
        self.level = int(r.integers(-5, 6))
        return self._obs(), {}

    def step(self, action):
        a = np.asarray(action, np.int64).reshape(-1)
        r = self.np_random
        push = float(a.sum()) / 4.0
        self.pos = np.clip(self.pos + push * 0.1 + r.normal(0.0, 0.05, 2), -1.0, 1.0)
        self.count = min(self.count + 1, 16)
        self.flags = (self.flags ^ (a[: 3].sum() % 2)).astype(np.int8)
        self.img = np.roll(self.img, int(a[0]) + 1, axis=0)
        self.level = int(np.clip(self.level + int(a[-1]) - 1, -5, 5))
        reward = float(self.pos @ np.array([0.3, -0.7])) + 0.01 * float(a.sum())
        terminated = bool(r.random() < 0.08)
        return self._obs(), reward, terminated, False, {}


COUNT = [0]


class FlakyDictSpaces(DictSpaces):
    """``DictSpaces`` that raises once, at step ``fail_at`` of its second instance after ``COUNT[0] = -1``."""

    def __init__(self, fail_at=5, **kwargs):
        super().__init__(**kwargs)
        COUNT[0] += 1
        self.me, self.fail_at, self.steps = COUNT[0], fail_at, 0

    def step(self, action):
        self.steps += 1
        if self.me == 1 and self.steps == self.fail_at:
            raise RuntimeError("flaky env: step failed on purpose")
        return super().step(action)


class TupleInDict(gym.Env):
    """A dict observation with a Tuple in it."""

    observation_space = spaces.Dict({"foo": spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3)))})
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"foo": (0, 0)}, {}

    def step(self, action):
        return {"foo": (0, 0)}, 0.0, False, False, {}


gym.register(id="DictSpaces-v0", entry_point=DictSpaces, max_episode_steps=15)
gym.register(id="FlakyDictSpaces-v0", entry_point=FlakyDictSpaces, max_episode_steps=15)
gym.register(id="TupleInDict-v0", entry_point=TupleInDict)
