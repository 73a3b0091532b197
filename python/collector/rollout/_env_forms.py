"""torchrl's forms of ``create_env_fn`` turned into what rollout's nodes build: an env
id and the keyword arguments of ``gym.make`` (its ``env_config``).

torchrl takes an id, a callable (a function, an ``EnvCreator``), an env (``GymEnv``,
a ``TransformedEnv``), or a list of them, one per collector. Nodes build their envs
themselves from an id and a config, so a form is served when it says one: a
``GymEnv`` (its id and ``gym.make`` keyword arguments), a ``TransformedEnv`` over one
whose transforms rollout already applies (``StepCounter`` without a limit: rollout
records ``step_count``; ``RewardSum`` on the reward: the collector writes
``episode_reward``; ``InitTracker``: ``is_init``, recorded by the nodes for a
recurrent actor, written by the collector otherwise; a ``TensorDictPrimer`` of zero
initial states, as a recurrent module's ``make_tensordict_primer()`` makes: the nodes
keep the actor's state themselves, so the primer's keys need only be the actor's,
which the collector checks once the actor is exported), and a callable that builds
such an env (called once, here, as torchrl's ``EnvCreator`` does to read the specs).
Any other torchrl env (other transforms, ``frame_skip``, ``from_pixels``, an env that
is not a ``GymEnv``) is shipped to Python nodes as a cloudpickle (:func:`_pickled`):
the function or ``EnvCreator`` given, or the env itself, under the env name
``_pickled_env.PICKLED_ENV``; nodes load it only when started with ``--allow-pickled-env`` (it runs
this process's code) and step it as torchrl does. What can be neither is refused before
any node starts, with the sentence that says what to pass.
"""

from __future__ import annotations

import json
from typing import Any, List, Optional, Tuple

from ._collector import _config_error as config_error

# What a node is asked to build: an env id, gym.make's keyword arguments (or None), and
# the entries the env's transforms add that the collector writes into each TensorDict
# (``"episode_reward"``: RewardSum's; ``"is_init"``: InitTracker's) or, prefixed with
# ``PRIMED``, that a primer primes (the recurrent actor's state, kept by the nodes).
# A fourth entry: the env's spaces (PROTOCOL.md §3) when this process could read them, for
# exporting a torch policy (None otherwise, and for an env named by its id).
EnvForm = Tuple[str, Optional[dict], Tuple[str, ...], Optional[dict]]
PRIMED = "primed:"
#: Among the entries: a torchrl ``PettingZooWrapper`` without ``use_mask`` (its batches have
#: no agent masks, so the collector leaves the nodes' out of each TensorDict).
NO_AGENT_MASKS = "no-agent-masks"
#: Among the entries: a torchrl ``PettingZooWrapper`` with ``done_on_any=True`` (torchrl's
#: default for parallel envs): the run's nodes end an episode once any agent is done;
#: ``DONE_ON_ALL``: one with ``done_on_any=False``, once every agent is.
DONE_ON_ANY = "done-on-any"
DONE_ON_ALL = "done-on-all"

_WHAT_TO_PASS = "pass an env id (e.g. \"Pendulum-v1\"), a torchrl env, or a function making one"


def resolve(create_env_fn: Any, field: str = "create_env_fn") -> Any:
    """``create_env_fn`` as an env id (a string, unchanged), one :data:`EnvForm`, or a
    list of them (one per node)."""
    if isinstance(create_env_fn, str):
        return create_env_fn
    if isinstance(create_env_fn, (list, tuple)):
        if not create_env_fn:
            raise config_error(field, "an empty list: give one env (or env function) per node")
        return [_one(f, field) for f in create_env_fn]
    return _one(create_env_fn, field)


class _NotByName(Exception):
    """The env is not one the nodes build from an id and a config: it is pickled."""


def _one(form: Any, field: str) -> EnvForm:
    if isinstance(form, str):
        return form, None, (), None
    if _is_env(form):
        return _by_name_or_pickled(form, form, field)
    if callable(form):
        try:
            env = form()
        except Exception as e:
            raise config_error(field, f"calling {_name(form)} to read the env it makes failed: {type(e).__name__}: {e}") from e
        try:
            if isinstance(env, str) or not _is_env(env):
                raise config_error(field, f"{_name(form)} returned {type(env).__name__}, not a torchrl env; {_WHAT_TO_PASS}")
            return _by_name_or_pickled(form, env, field)
        finally:
            _close(env)
    raise config_error(field, f"expected an env id, a torchrl env, a function making one, or a list of them; got {type(form).__name__}")


def _by_name_or_pickled(form: Any, env: Any, field: str) -> EnvForm:
    """``env`` (made by ``form``, or ``form`` itself) by its id when the nodes build it from
    one, else ``form`` pickled."""
    try:
        name, config, added = _of_env(env, field)
    except _NotByName:
        return _pickled(form, env, field)
    return name, config, added, None


def _pickled(form: Any, env: Any, field: str) -> EnvForm:
    """``form`` cloudpickled for Python nodes (``_pickled_env.pickle_form``), with the
    entries the collector writes for its served transforms (``added``) and the observation
    keys they are on the node (``exclude``: ``StepCounter``'s, a served ``RewardSum``'s and
    ``InitTracker``'s, a primer's), which are not observations of the batch."""
    from torchrl.envs import StepCounter, TransformedEnv

    from ._pickled_env import pickle_form

    added: List[str] = []
    exclude: List[str] = []
    inner = env
    while isinstance(inner, TransformedEnv):
        for t in _transforms(inner.transform):
            if isinstance(t, StepCounter):
                exclude.append(_dotted(t.step_count_key))
                continue
            served = _primed(t, field) or _served(t)
            if served:
                added += served
                exclude += [k[len(PRIMED) :] if k.startswith(PRIMED) else k for k in served]
        inner = inner.base_env
    name, config, specs = pickle_form(form, env, field, exclude, _name(form))
    return name, config, tuple(sorted(set(added))), specs


def _dotted(key: Any) -> str:
    return key if isinstance(key, str) else ".".join(key)


def _is_env(obj: Any) -> bool:
    try:
        from torchrl.envs import EnvBase
    except ImportError:
        return False
    return isinstance(obj, EnvBase)


def _of_env(env: Any, field: str) -> EnvForm:
    from torchrl.envs import TransformedEnv

    if isinstance(env, TransformedEnv):
        added: List[str] = []
        for t in _transforms(env.transform):
            served = _primed(t, field) or _served(t)
            if served is None:
                raise _NotByName(f"the transform {type(t).__name__}")
            added += served
        name, config, inner = _of_env(env.base_env, field)
        return name, config, tuple(sorted(set(added) | set(inner)))
    if type(env).__name__ in ("PettingZooWrapper", "PettingZooEnv"):
        return _pettingzoo(env, field)
    if type(env).__name__ != "GymEnv":
        raise _NotByName(f"a {type(env).__name__}")
    kwargs = getattr(env, "_constructor_kwargs", None)
    if not isinstance(kwargs, dict) or "env_name" not in kwargs:
        raise _NotByName(f"a {type(env).__name__}")
    for option, default in (("frame_skip", 1), ("from_pixels", False)):
        value = getattr(env, option, default)
        if value not in (default, None):
            raise _NotByName(f"GymEnv's {option}={value!r}")
    config = {k: v for k, v in kwargs.items() if k not in ("env_name", "disable_env_checker")}
    try:
        json.dumps(config)
    except (TypeError, ValueError):
        raise _NotByName(f"gym.make's keyword arguments of {kwargs['env_name']}") from None
    return str(kwargs["env_name"]), (config or None), ()


def _pettingzoo(env: Any, field: str) -> Tuple[str, Optional[dict], Tuple[str, ...]]:
    """A torchrl ``PettingZooWrapper`` (or ``PettingZooEnv``) as the nodes build it: the
    PettingZoo env's module as a ``pettingzoo:<module>`` id and its constructor's keyword
    arguments (PettingZoo envs keep them, ``EzPickle``), made there with the module's own
    ``parallel_env``. The wrapper's options the nodes follow are checked: its groups must
    be torchrl's default ones, actions categorical, no ``return_state``; ``use_mask``
    says whether the TensorDicts keep the agent masks; ``done_on_any`` (torchrl's default
    for a parallel env: True) whether the nodes end an episode once any agent is done
    (``DONE_ON_ANY``) or once every agent is (``DONE_ON_ALL``)."""
    from ._spaces import PETTINGZOO, torchrl_groups

    pz = getattr(env, "_env", None)
    raw = getattr(pz, "unwrapped", None)
    kwargs = getattr(raw, "_ezpickle_kwargs", None)
    if pz is None or raw is None or not isinstance(kwargs, dict) or getattr(raw, "_ezpickle_args", ()):
        raise config_error(
            field,
            f"the PettingZoo env of this {type(env).__name__} does not say how it was made (no EzPickle keyword "
            "arguments): pass \"pettingzoo:<module>\" with env_config",
        )
    module = type(raw).__module__
    for name in ("categorical_actions", "return_state"):
        if getattr(env, name, name == "categorical_actions") != (name == "categorical_actions"):
            raise config_error(field, f"{type(env).__name__}({name}={getattr(env, name)!r}) is not served: rollout's nodes write categorical actions and no state")
    default = torchrl_groups(list(pz.possible_agents))
    if dict(env.group_map) != default:
        raise config_error(field, f"group_map {dict(env.group_map)} is not served: rollout's nodes group agents as torchrl does by default ({default})")
    config = {k: v for k, v in kwargs.items() if not (k == "render_mode" and v is None)}
    try:
        json.dumps(config)
    except (TypeError, ValueError):
        raise config_error(field, f"the keyword arguments {sorted(config)} of {module} are not JSON: pass \"pettingzoo:{module}\" with env_config") from None
    added = () if getattr(env, "use_mask", False) else (NO_AGENT_MASKS,)
    added += (DONE_ON_ANY,) if getattr(env, "done_on_any", False) else (DONE_ON_ALL,)
    return PETTINGZOO + module, (config or None), added


def _transforms(transform: Any) -> List[Any]:
    from torchrl.envs import Compose

    if isinstance(transform, Compose):
        return [t for inner in transform.transforms for t in _transforms(inner)]
    return [transform]


def _served(t: Any) -> Optional[List[str]]:
    """The entries the collector writes for transform ``t``, or ``None`` when it is not
    served: ``StepCounter`` without a limit (rollout records ``step_count`` itself),
    ``RewardSum`` of ``reward`` into ``episode_reward`` (written by the collector),
    ``InitTracker`` into ``is_init``."""
    from torchrl.envs import InitTracker, RewardSum, StepCounter

    if isinstance(t, StepCounter) and getattr(t, "max_steps", None) is None:
        return []
    if isinstance(t, RewardSum) and list(t.in_keys) == ["reward"] and list(t.out_keys) == ["episode_reward"]:
        return ["episode_reward"]
    if isinstance(t, InitTracker) and t.init_key == "is_init":
        return ["is_init"]
    return None


def _primed(t: Any, field: str) -> Optional[List[str]]:
    """A ``TensorDictPrimer``'s keys (dotted, prefixed with ``PRIMED``), or ``None``
    for another transform; a primer of other initial states than zero is refused:
    the nodes start every state at zero."""
    from torchrl.envs import TensorDictPrimer

    if not isinstance(t, TensorDictPrimer):
        return None
    keys = [k if isinstance(k, str) else ".".join(k) for k in t.primers.keys(True, True)]
    default = t.default_value  # a dict by key, a TensorDict (given as a dict) or one value
    values = default.values(True, True) if hasattr(default, "batch_size") else default.values() if isinstance(default, dict) else [default]
    if t.random or not all(_zero(v) for v in values):
        raise config_error(
            field,
            "the TensorDictPrimer draws random or non-zero initial states: rollout's nodes start a recurrent actor's "
            "state at zero on every reset (make_tensordict_primer()'s default); leave the primer out",
        )
    return [PRIMED + k for k in keys]


def _zero(value: Any) -> bool:
    try:
        return not callable(value) and float(value) == 0.0
    except (TypeError, ValueError):
        return False


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _close(env: Any) -> None:
    close = getattr(env, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - the env was only read; closing it is a courtesy
            pass
