"""Exploration modules the node runs after an ``onnx`` model (PROTOCOL.md §8, Exploration
modules; version 7): torchrl's ``OrnsteinUhlenbeckProcessModule``, DDPG's exploration.

The module's noise is a state per env, the last two tensors of the config's ``state`` list
(``_ou_prev_noise`` f32 ``[d]``, ``_ou_steps`` f32 ``[1]``) that the model never sees: the node
keeps, zeroes, records and checkpoints them with a recurrent model's own state
(``recurrent.RecurrentState``), so this module only checks the config and computes one step.
Its ``eps`` is a weight of the model (torchrl's ``eps`` buffer, annealed by the learner's
``step()``), read by the policy from each version of the weights.

The step is torchrl's ``_OrnsteinUhlenbeckProcess.add_sample`` in f32, in its order of
operations (the sigma slope computed in f64, as torchrl's Python float is), with the normal
draws handed in (:meth:`OrnsteinUhlenbeck.step`), so a test can replay it with the same draws.
The noise is added to the ``deterministic`` head's action as the protocol gives it, clipped
to the box (torchrl adds it before clipping: the same for an actor bounded to the box).

Version 8 adds torchrl's ``EGreedyModule`` (DQN's exploration, PROTOCOL.md §8, Q-value actors)
after the ``qvalue`` head: no state, only ``eps`` read from the weights as the OU module's is,
and one step (:meth:`EpsilonGreedy.step`) that replaces the greedy action of a row by a
uniform one with probability ``eps``.
"""

import math

import numpy as np

#: torchrl's keys of the module's state (its ``noise_key`` and ``steps_key``).
NOISE, STEPS = "_ou_prev_noise", "_ou_steps"
#: The config's ``exploration.kind`` of the Ornstein-Uhlenbeck module.
KIND = "ornstein_uhlenbeck"
#: The config's ``exploration.kind`` of the epsilon-greedy module.
EGREEDY = "epsilon_greedy"
#: The kinds an ``exploration`` config may name.
KINDS = (KIND, EGREEDY)
_FIELD = "spec.policy.config.exploration"
_STATE = "spec.policy.config.state"


class ExplorationError(ValueError):
    """The ``exploration`` config (or what it needs of the policy) is not servable; the
    message names the field."""


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(config, name):
    v = config.get(name)
    if not _number(v) or not math.isfinite(v):
        raise ExplorationError(f"{_FIELD}.{name} must be a finite number, got {v!r:.40}")
    return float(v)


class OrnsteinUhlenbeck:
    """The module of an ``exploration`` config (a map), checked field by field for an action
    of ``d`` values (ExplorationError naming the first field that does not fit)."""

    def __init__(self, config, d):
        if not isinstance(config, dict):
            raise ExplorationError(f"{_FIELD} must be a map, got {type(config).__name__}")
        if config.get("kind") != KIND:
            raise ExplorationError(f"{_FIELD}.kind must be {KIND!r}, got {config.get('kind')!r:.40}")
        #: The model's initializer holding ``eps``.
        self.eps_name = _eps_name(config)
        self.theta, self.mu = _finite(config, "theta"), _finite(config, "mu")
        self.sigma, self.dt = _finite(config, "sigma"), _finite(config, "dt")
        if self.dt <= 0:
            raise ExplorationError(f"{_FIELD}.dt must be > 0, got {self.dt}")
        if self.sigma < 0:
            raise ExplorationError(f"{_FIELD}.sigma must be >= 0, got {self.sigma}")
        smin = config.get("sigma_min")
        if smin is not None and (not _number(smin) or not math.isfinite(smin) or smin < 0):
            raise ExplorationError(f"{_FIELD}.sigma_min must be nil or a finite number >= 0, got {smin!r:.40}")
        n = config.get("n_steps_annealing")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ExplorationError(f"{_FIELD}.n_steps_annealing must be an integer >= 1, got {n!r:.40}")
        x0 = config.get("x0", [])
        if x0 is None:
            x0 = []
        if not isinstance(x0, list) or not all(_number(v) and math.isfinite(v) for v in x0):
            raise ExplorationError(f"{_FIELD}.x0 must be an array of finite numbers, got {x0!r:.60}")
        if len(x0) not in (0, 1, d):
            raise ExplorationError(
                f"{_FIELD}.x0 has {len(x0)} values: give none, one, or one per action dimension ({d})"
            )
        self.d = d
        self.n_steps_annealing = n
        self.sigma_min = None if smin is None else float(smin)
        f32 = np.float32
        # torchrl: m = -(sigma - sigma_min) / n_steps_annealing and c = sigma, Python floats;
        # without sigma_min, m = 0 and the floor is sigma itself.
        floor = self.sigma if smin is None else self.sigma_min
        self._m = f32(0.0 if smin is None else -(self.sigma - floor) / float(n))
        self._c, self._floor = f32(self.sigma), f32(floor)
        self._theta, self._mu, self._dt = f32(self.theta), f32(self.mu), f32(self.dt)
        self._root_dt = f32(np.sqrt(self.dt))
        self.x0 = np.broadcast_to(np.array(x0 or [0.0], np.float32), (d,)).copy()

    def state(self):
        """The module's state tensors, ``[(name, shape)]``, as the config's ``state`` lists them."""
        return [(NOISE, (self.d,)), (STEPS, (1,))]

    def current_sigma(self, steps):
        """The diffusion after ``steps`` (f32 ``[k, 1]``) noisy steps of an episode: torchrl's
        ``current_sigma``, ``max(m * steps + sigma, floor)``."""
        return np.maximum(self._m * steps + self._c, self._floor)

    def step(self, action, noise, steps, eps, z):
        """One step for ``k`` envs: the head's ``action`` (f32 ``[k, d]``, clipped to the box), each
        env's state ``noise`` (``[k, d]``) and ``steps`` (``[k, 1]``) as the frame reads them
        (zero where it starts an episode), ``eps`` (f32) and standard normal draws ``z``
        (``[k, d]``). Returns ``(action + eps * noise', noise' - x0, steps + 1)``, all f32,
        the noisy action not clipped yet."""
        f32 = np.float32
        p = noise.astype(f32) + self.x0
        sigma = self.current_sigma(steps.astype(f32))
        new = p + self._theta * (self._mu - p) * self._dt + sigma * self._root_dt * z.astype(f32)
        return action.astype(f32) + f32(eps) * new, new - self.x0, steps.astype(f32) + f32(1)


def _eps_name(config):
    """The initializer name ``config.eps`` gives (ExplorationError naming the field if none)."""
    eps = config.get("eps")
    if not isinstance(eps, str) or not eps:
        raise ExplorationError(f"{_FIELD}.eps must name the model's f32 initializer holding eps, got {eps!r:.40}")
    return eps


class EpsilonGreedy:
    """torchrl's ``EGreedyModule`` of an ``exploration`` config (a map) after the ``qvalue``
    head on a discrete action of ``n`` choices: it keeps no state, and its ``eps`` is a weight
    of the model (the learner anneals it with the module's ``step()``)."""

    def __init__(self, config, n):
        if config.get("kind") != EGREEDY:
            raise ExplorationError(f"{_FIELD}.kind must be {EGREEDY!r}, got {config.get('kind')!r:.40}")
        #: The model's initializer holding ``eps``.
        self.eps_name = _eps_name(config)
        self.n = n

    def state(self):
        """No state tensors: each step is drawn afresh."""
        return []

    def step(self, greedy, eps, rng):
        """The actions of ``k`` rows whose greedy indices are ``greedy`` (int64 ``[k]``): per
        row a uniform ``u`` in [0, 1) from ``rng``; the rows where ``u < eps`` take a uniform
        index in ``0..n`` (a second draw, made for those rows alone, in row order), the
        others their greedy index. torchrl's module draws the same way
        (``rand < eps``, then the spec's ``rand()``)."""
        u = rng.random(greedy.shape[0])
        explore = u < np.float64(eps)
        out = np.array(greedy, np.int64)
        m = int(explore.sum())
        if m:
            out[explore] = rng.integers(0, self.n, size=m, dtype=np.int64)
        return out


def _module(value, action, head):
    """The exploration module of the config's ``exploration`` map ``value``, dispatched on
    its ``kind`` so that each module's refusals name what that module needs."""
    if not isinstance(value, dict):
        raise ExplorationError(f"{_FIELD} must be a map, got {type(value).__name__}")
    kind = value.get("kind")
    if kind == EGREEDY:
        if head != "qvalue":
            raise ExplorationError(f"{_FIELD}: epsilon-greedy exploration follows the `qvalue` head, not {head!r}")
        return EpsilonGreedy(value, int(action.n))
    if kind != KIND:
        raise ExplorationError(f"{_FIELD}.kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r:.40}")
    if action.discrete or action.kind != "box":
        raise ExplorationError(f"{_FIELD}: Ornstein-Uhlenbeck noise acts on a box action, the env's is {action.kind}")
    if head != "deterministic":
        raise ExplorationError(f"{_FIELD}: Ornstein-Uhlenbeck noise follows the `deterministic` head, not {head!r}")
    return OrnsteinUhlenbeck(value, int(action.low.size))


def from_config(config, state, action, head):
    """``(module, model_state)`` of an ``onnx`` config: the module of its ``exploration``
    (None when absent or nil) and the ``state`` tensors the model itself takes (``state``:
    ``[(name, shape)]``, checked already; an OU module's are the last two, in this order; an
    epsilon-greedy module has none), for ``action`` (``policy.ActionSpace``, one the head
    takes: checked already) and the config's ``head``. ExplorationError naming the field when
    the module cannot serve them: an unknown kind, the wrong head (or, for OU, a discrete
    action), OU's two state tensors not the list's last two."""
    value = config.get("exploration")
    if value is None:
        return None, list(state)
    module = _module(value, action, head)
    want = module.state()
    if not want:
        return module, list(state)
    own = [(n, tuple(s)) for n, s in state[-len(want):]]
    if own != want:
        show = ", ".join(f"`{n}` {list(s)}" for n, s in want)
        got = ", ".join(f"`{n:.40}` {list(s)}" for n, s in state) or "nothing"
        raise ExplorationError(f"{_STATE} must end with the Ornstein-Uhlenbeck module's {show}, it lists {got}")
    return module, list(state[: -len(want)])


def eps_of(module, weights):
    """The f32 value of the weight ``module.eps_name`` in ``weights`` (``{name: array}``, the
    model's f32 initializers): ExplorationError naming ``exploration.eps`` when there is none
    of one element."""
    w = weights.get(module.eps_name)
    if w is None:
        raise ExplorationError(
            f"{_FIELD}.eps names `{module.eps_name:.128}`, which is not an f32 initializer of the model"
        )
    if w.size != 1:
        raise ExplorationError(
            f"{_FIELD}.eps names `{module.eps_name:.128}`, an initializer of {w.size} elements, not one"
        )
    return np.float32(w.reshape(-1)[0])
