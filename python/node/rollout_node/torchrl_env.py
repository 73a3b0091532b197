"""A torchrl env the trainer ships as a cloudpickle (PROTOCOL.md §3, Pickled torchrl env),
stepped as torchrl steps it and seen by the node as a gymnasium env.

The spec's env is ``{name: PICKLED_ENV, config: {cloudpickle, python, exclude}}``: the
base64 of a cloudpickled function (or ``EnvCreator``) making a torchrl ``EnvBase``, or of
an env itself; the ``major.minor`` of the trainer's Python (a pickle of code by value loads
on that version only); and the observation keys the collector writes itself
(``step_count``, a ``RewardSum``'s ``episode_reward``, ``is_init``, a primer's states),
which are not observations of the batch. Unpickling runs the trainer's code: a node loads
it only when started with ``--allow-pickled-env``.

:class:`TorchrlEnv` steps the env as torchrl's ``rollout`` does (``set_seed`` then
``reset()`` for a seeded reset, ``step`` then ``step_mdp``, its transforms included), and
maps torchrl's specs to gymnasium spaces (:func:`space_of`), so the node's loop, frame
columns, dict observations and supervision are the ones of any gymnasium env.
"""

import base64
import binascii
import sys

import gymnasium as gym
import numpy as np

#: The env name of a pickled torchrl env (no gymnasium id: an older node fails to make it).
PICKLED_ENV = "pickled-torchrl-env"
#: The largest pickle a node loads (and a collector ships): 16 MiB, 22 MiB as base64 in
#: the ``welcome`` frame, under the default ``max_frame`` of 256 MiB.
MAX_PICKLE_BYTES = 16 << 20
#: The node's flag that lets it load a pickle.
FLAG = "--allow-pickled-env"


#: The keys of ``exclude`` when none are given (a replay's ``--pickled-env``): the ones rollout
#: writes itself for torchrl's ``StepCounter``, ``RewardSum`` and ``InitTracker``.
DEFAULT_EXCLUDE = ("step_count", "episode_reward", "is_init")


def config_of(blob, exclude=DEFAULT_EXCLUDE):
    """The spec's ``config`` of the pickle ``blob`` (bytes of ``cloudpickle.dumps``)."""
    return {"cloudpickle": base64.b64encode(blob).decode("ascii"), "python": python_version(), "exclude": list(exclude)}


class PickledEnvError(Exception):
    """The pickled env cannot be loaded or stepped here; the message says why in one sentence."""


def python_version():
    """This interpreter's ``major.minor``, as the config's ``python`` holds it."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def factory(config, allowed):
    """A function making one :class:`TorchrlEnv` from the spec's ``config`` (each call a
    fresh env: the pickle is loaded again). PickledEnvError when ``allowed`` is false (the
    node was not started with ``--allow-pickled-env``) or the config is not one."""
    if not allowed:
        raise PickledEnvError(
            "the trainer sent a torchrl env as a pickle, which runs the trainer's code on this node: "
            f"start the node with {FLAG} to accept it (only for a trainer you trust)"
        )
    if not isinstance(config, dict):
        raise PickledEnvError(f"spec.env.config of {PICKLED_ENV} must be a map, got {type(config).__name__}")
    text, version, exclude = config.get("cloudpickle"), config.get("python"), config.get("exclude", [])
    if not isinstance(text, str):
        raise PickledEnvError("spec.env.config.cloudpickle must be the pickle as a base64 string")
    if not isinstance(exclude, list) or not all(isinstance(k, str) for k in exclude):
        raise PickledEnvError("spec.env.config.exclude must be an array of strings")
    if len(text) > (MAX_PICKLE_BYTES + 2) // 3 * 4:
        raise PickledEnvError(f"the pickled env is over {MAX_PICKLE_BYTES} bytes")
    if version != python_version():
        raise PickledEnvError(
            f"the env was pickled by Python {version}, this node runs Python {python_version()}: "
            "run the node with the trainer's Python version (a pickle of code loads on that version only)"
        )
    try:
        blob = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise PickledEnvError(f"spec.env.config.cloudpickle is not base64: {e}") from None
    try:
        import cloudpickle
        import torchrl.envs  # noqa: F401 - the env's own module, said now if missing
    except ImportError as e:
        raise PickledEnvError(f"a pickled torchrl env needs torchrl and cloudpickle on the node: {e}") from None
    return _loader(cloudpickle, blob, tuple(exclude))


def _loader(cloudpickle, blob, exclude):
    def make():
        from torchrl.envs import EnvBase

        try:
            obj = cloudpickle.loads(blob)
        except ModuleNotFoundError as e:
            raise PickledEnvError(
                f"cannot unpickle the env: {e}: make that module importable on the node, or have the trainer "
                "pickle it by value (cloudpickle.register_pickle_by_value(module))"
            ) from None
        except Exception as e:
            raise PickledEnvError(f"cannot unpickle the env: {type(e).__name__}: {e}") from None
        if not isinstance(obj, EnvBase):
            if not callable(obj):
                raise PickledEnvError(f"the pickle holds a {type(obj).__name__}, not a torchrl env or a function making one")
            try:
                obj = obj()
            except Exception as e:
                raise PickledEnvError(f"the pickled function making the env raised {type(e).__name__}: {e}") from None
            if not isinstance(obj, EnvBase):
                raise PickledEnvError(f"the pickled function returned a {type(obj).__name__}, not a torchrl env")
        return TorchrlEnv(obj, exclude)

    return make


def space_of(spec, key, action=False):
    """The gymnasium space of torchrl spec ``spec`` (at batch key ``key``): ``Bounded`` and
    ``Unbounded`` -> ``Box`` (unbounded floats to infinity, integers to their dtype's
    range); ``Categorical`` of one value -> ``Discrete``; ``OneHot`` -> ``Discrete`` for an
    action (the node gives the index, encoded for the env), a 0/1 ``Box`` for an
    observation; ``MultiCategorical`` -> ``MultiDiscrete``; ``Binary`` -> ``MultiBinary``;
    ``Composite`` -> ``Dict``. PickledEnvError naming ``key`` for any other."""
    from torchrl.data import Binary, Bounded, Categorical, Composite, MultiCategorical, OneHot, Unbounded

    dtype = getattr(spec, "dtype", None)
    shape = tuple(int(d) for d in spec.shape)
    if isinstance(spec, Composite):
        return gym.spaces.Dict({name: space_of(spec[name], f"{key}.{name}", action) for name in spec.keys()})
    np_dtype = None if dtype is None else _numpy_dtype(dtype, key)
    if isinstance(spec, OneHot):
        if action:
            return gym.spaces.Discrete(int(spec.space.n))
        return gym.spaces.Box(0, 1, shape, np_dtype)
    if isinstance(spec, MultiCategorical):
        return gym.spaces.MultiDiscrete(np.asarray(spec.nvec, np.int64).reshape(-1))
    if isinstance(spec, Binary):
        return gym.spaces.MultiBinary(int(np.prod(shape)))
    if isinstance(spec, Categorical):
        if int(np.prod(shape)) == 1:
            return gym.spaces.Discrete(int(spec.space.n))
        return gym.spaces.MultiDiscrete(np.full(int(np.prod(shape)), int(spec.space.n), np.int64))
    if isinstance(spec, Bounded):
        low = spec.space.low.detach().cpu().numpy().astype(np_dtype)
        high = spec.space.high.detach().cpu().numpy().astype(np_dtype)
        return gym.spaces.Box(low, high, shape, np_dtype)
    if isinstance(spec, Unbounded):
        if np.issubdtype(np_dtype, np.floating):
            return gym.spaces.Box(-np.inf, np.inf, shape, np_dtype)
        if np_dtype == np.bool_:
            return gym.spaces.Box(0, 1, shape, np_dtype)
        info = np.iinfo(np_dtype)
        return gym.spaces.Box(info.min, info.max, shape, np_dtype)
    raise PickledEnvError(f"{key}: torchrl's {type(spec).__name__} has no space the node collects")


def _numpy_dtype(dtype, key):
    import torch

    try:
        return torch.empty((), dtype=dtype).numpy().dtype
    except TypeError:
        raise PickledEnvError(f"{key}: torchrl's dtype {dtype} has no numpy dtype") from None


def _leaf_keys(composite, exclude):
    """The observation keys of ``composite`` (tuples), in its order, without ``exclude``."""
    out = []
    for key in composite.keys(True, True):
        key = key if isinstance(key, tuple) else (key,)
        if ".".join(key) not in exclude and key[0] not in exclude:
            out.append(key)
    return out


class TorchrlEnv(gym.Env):
    """A torchrl ``EnvBase`` (unbatched) as a gymnasium env: its observation is
    ``observation`` when that is its one observation key, else a dict of its keys (nested
    keys nest); its action is ``action``, its reward ``reward``; ``terminated`` and
    ``truncated`` are torchrl's (``done`` alone counts as terminated)."""

    def __init__(self, env, exclude=()):
        super().__init__()
        if tuple(env.batch_size) != ():
            raise PickledEnvError(
                f"the env has batch_size {list(env.batch_size)}: give one env (unbatched), "
                "rollout's nodes run envs_per_node of them"
            )
        if [k for k in env.action_keys] != ["action"] or [k for k in env.reward_keys] != ["reward"]:
            raise PickledEnvError(
                f"the env's action keys are {list(env.action_keys)} and reward keys {list(env.reward_keys)}: "
                "rollout's nodes step envs of one `action` and one `reward`"
            )
        self.env = env
        self.exclude = set(exclude)
        spec = env.observation_spec
        self.keys = _leaf_keys(spec, self.exclude)
        if not self.keys:
            raise PickledEnvError("the env has no observation key (besides those the collector writes)")
        self.single = self.keys == [("observation",)]
        if self.single:
            self.observation_space = space_of(spec["observation"], "observation")
        else:
            self.observation_space = _dict_space(spec, self.keys)
        self.action_spec = env.action_spec
        self.action_space = space_of(self.action_spec, "action", action=True)
        from torchrl.data import OneHot

        self._one_hot = isinstance(self.action_spec, OneHot)
        self._td = None

    def reset(self, *, seed=None, options=None):
        """torchrl's ``set_seed(seed)`` first when a seed is given, then ``reset()``."""
        if seed is not None:
            self.env.set_seed(int(seed))
        self._td = self.env.reset()
        return self._observation(self._td), {}

    def step(self, action):
        import torch
        from torchrl.envs.utils import step_mdp

        td = self._td
        if td is None:
            raise PickledEnvError("step before reset")
        td.set("action", self._action(action, torch))
        out = self.env.step(td)
        nxt = out.get("next")
        done = bool(nxt.get("done").any()) if "done" in nxt.keys() else False
        te = bool(nxt.get("terminated").any()) if "terminated" in nxt.keys() else done
        tr = bool(nxt.get("truncated").any()) if "truncated" in nxt.keys() else False
        if done and not (te or tr):
            tr = True
        obs = self._observation(nxt)
        reward = float(nxt.get("reward").reshape(-1)[0])
        self._td = step_mdp(out, keep_other=True)
        return obs, reward, te, tr, {}

    def _action(self, action, torch):
        spec = self.action_spec
        if self._one_hot:
            return torch.nn.functional.one_hot(torch.as_tensor(int(action)), int(spec.space.n)).to(spec.dtype)
        return torch.as_tensor(np.asarray(action)).to(spec.dtype).reshape(spec.shape)

    def _observation(self, td):
        if self.single:
            return td.get("observation").detach().cpu().numpy()
        out = {}
        for key in self.keys:
            d = out
            for name in key[:-1]:
                d = d.setdefault(name, {})
            d[key[-1]] = td.get(key).detach().cpu().numpy()
        return out

    def close(self):
        try:
            self.env.close()
        except Exception:  # noqa: BLE001 - closing is a courtesy; the node goes on
            pass


def _dict_space(spec, keys):
    """The ``Dict`` space of the observation ``keys`` of composite ``spec``."""
    tree = {}
    for key in keys:
        d = tree
        for name in key[:-1]:
            d = d.setdefault(name, {})
        d[key[-1]] = space_of(spec[key], "observation." + ".".join(key))

    def build(d):
        return gym.spaces.Dict({k: build(v) if isinstance(v, dict) else v for k, v in d.items()})

    return build(tree)
