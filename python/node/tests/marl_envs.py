"""A real PettingZoo env under other agent names, for ``pettingzoo:marl_envs:renamed`` ids:
no env of mpe2 or butterfly puts agents of different spaces under one ``<prefix>_<int>``
prefix, which the node must refuse."""

import importlib

from pettingzoo import ParallelEnv


class Renamed(ParallelEnv):
    """``env`` with its agent ``old`` called ``names[old]`` (the others keep theirs)."""

    def __init__(self, env, names):
        self.env, self.to_new = env, dict(names)
        self.to_old = {v: k for k, v in self.to_new.items()}
        self.metadata = env.metadata
        self.possible_agents = [self._new(a) for a in env.possible_agents]

    def _new(self, a):
        return self.to_new.get(a, a)

    def _dict(self, d):
        return {self._new(a): v for a, v in d.items()}

    @property
    def agents(self):
        return [self._new(a) for a in self.env.agents]

    def observation_space(self, agent):
        return self.env.observation_space(self.to_old.get(agent, agent))

    def action_space(self, agent):
        return self.env.action_space(self.to_old.get(agent, agent))

    def reset(self, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return self._dict(obs), self._dict(info)

    def step(self, actions):
        out = self.env.step({self.to_old.get(a, a): v for a, v in actions.items()})
        return tuple(self._dict(d) for d in out)

    def close(self):
        self.env.close()


def renamed(module, names, **config):
    """``module``'s ``parallel_env(**config)`` with agents renamed by ``names``."""
    return Renamed(importlib.import_module(module).parallel_env(**config), names)


#: ParallelEnvs ``flaky`` made in this process (a test sets it to choose which one fails).
MADE = [0]


class Flaky(Renamed):
    """``env`` that raises at its ``fail_at``-th step if it is the ``which``-th env made."""

    def __init__(self, env, fail_at, which):
        super().__init__(env, {})
        MADE[0] += 1
        self.fails, self.fail_at, self.steps = MADE[0] == which, fail_at, 0

    def step(self, actions):
        self.steps += 1
        if self.fails and self.steps == self.fail_at:
            raise RuntimeError("flaky env: step failed on purpose")
        return super().step(actions)


def flaky(module, fail_at, which, **config):
    """``module``'s ``parallel_env(**config)``; the ``which``-th made raises at step ``fail_at``."""
    return Flaky(importlib.import_module(module).parallel_env(**config), fail_at, which)


class DictObs(Renamed):
    """``env`` whose observations are dicts: ``{"pos": obs[:2], "rest": {"other": obs[2:]}}``
    (no installed PettingZoo env observes dicts per agent)."""

    def __init__(self, env):
        super().__init__(env, {})
        from gymnasium import spaces

        self._spaces = {}
        for a in env.possible_agents:
            box = env.observation_space(a)
            self._spaces[a] = spaces.Dict({
                "pos": spaces.Box(box.low[:2], box.high[:2], dtype=box.dtype),
                "rest": spaces.Dict({"other": spaces.Box(box.low[2:], box.high[2:], dtype=box.dtype)}),
            })

    def observation_space(self, agent):
        return self._spaces[agent]

    @staticmethod
    def split(obs):
        """One agent's flat observation as this env's dict."""
        return {"pos": obs[:2], "rest": {"other": obs[2:]}}

    def reset(self, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return {a: self.split(o) for a, o in obs.items()}, info

    def step(self, actions):
        obs, r, te, tr, info = self.env.step(actions)
        return {a: self.split(o) for a, o in obs.items()}, r, te, tr, info


def dict_obs(module, **config):
    """``module``'s ``parallel_env(**config)`` observing dicts (``DictObs``)."""
    return DictObs(importlib.import_module(module).parallel_env(**config))
