"""torchrl's exploration modules as the nodes run them (PROTOCOL.md §8):
``OrnsteinUhlenbeckProcessModule`` (DDPG's; Exploration modules): the actor before it is
exported as the ``deterministic`` head, and the module becomes the config's
``exploration`` with two state tensors the nodes keep per env (``_ou_prev_noise`` ``[d]``,
``_ou_steps`` ``[1]``); ``EGreedyModule`` (DQN's; Q-value actors): after the ``qvalue``
head, ``{"kind": "epsilon_greedy"}``, no state.

A module's ``eps`` (annealed by its ``step()`` in the learner) must reach the nodes with
``update_policy_weights_()``, so it is made an initializer of the model, named as the
buffer's ``state_dict`` name, read by an ``Identity`` node into an extra output (``ou_eps``,
``egreedy_eps``; an initializer no node reads would be dropped from the graph, or not be one).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ._collector import _config_error as config_error

#: torchrl's keys of the module's state, and their ``next`` keys in a batch.
NOISE, STEPS = "_ou_prev_noise", "_ou_steps"
#: What TensorDict batches leave out: torchrl's collectors drop private keys.
PRIVATE_KEYS = (NOISE, STEPS, ("next", NOISE), ("next", STEPS))
#: The graph output holding ``eps`` (read by no node: it keeps the initializer in the model).
EPS_OUTPUT = "ou_eps"
#: The same for an ``EGreedyModule``'s ``eps``.
EGREEDY_EPS_OUTPUT = "egreedy_eps"
#: ``n_steps_annealing`` written when the module anneals nothing: torchrl keeps no count
#: then (``m = 0``), and the nodes read none without ``sigma_min``.
_NO_ANNEALING = 1000


def ou_module(mods: List[Any]) -> Optional[Any]:
    """The ``OrnsteinUhlenbeckProcessModule`` ending the actor's flat modules, or ``None``."""
    try:
        from torchrl.modules import OrnsteinUhlenbeckProcessModule
    except ImportError:  # pragma: no cover - without torchrl no actor has one
        return None
    return mods[-1] if mods and isinstance(mods[-1], OrnsteinUhlenbeckProcessModule) else None


def egreedy_module(mods: List[Any]) -> Optional[Any]:
    """The ``EGreedyModule`` ending the actor's flat modules, or ``None``."""
    try:
        from torchrl.modules import EGreedyModule
    except ImportError:  # pragma: no cover - without torchrl no actor has one
        return None
    return mods[-1] if mods and isinstance(mods[-1], EGreedyModule) else None


def _scalar(name: str, v: Any) -> float:
    """``v`` (a number or a one-element tensor) as a finite float, else a ConfigError."""
    try:
        import torch

        if isinstance(v, torch.Tensor):
            if v.numel() != 1:
                raise config_error("policy", f"OrnsteinUhlenbeckProcessModule's {name} has {v.numel()} values: rollout's nodes take one number")
            v = v.item()
        x = float(v)
    except (TypeError, ValueError):
        raise config_error("policy", f"OrnsteinUhlenbeckProcessModule's {name} is {type(v).__name__}, not a number") from None
    if not math.isfinite(x):
        raise config_error("policy", f"OrnsteinUhlenbeckProcessModule's {name} is {x}: rollout's nodes take a finite number")
    return x


def _x0(v: Any, d: int) -> List[float]:
    """torchrl's ``x0`` (a number, a tensor or an array) as the config's list: ``[]`` for 0,
    one value for any other number, else one per action dimension."""
    try:
        import torch

        if isinstance(v, torch.Tensor):
            v = v.detach().cpu().double().numpy()
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        raise config_error("policy", f"OrnsteinUhlenbeckProcessModule's x0 is {type(v).__name__}, not numbers") from None
    if not np.isfinite(a).all():
        raise config_error("policy", "OrnsteinUhlenbeckProcessModule's x0 holds a value that is not finite")
    if a.ndim == 0 or a.shape == (1,):
        x = float(a.reshape(-1)[0])
        return [] if x == 0.0 else [x]
    if a.shape != (d,):
        raise config_error(
            "policy",
            f"OrnsteinUhlenbeckProcessModule's x0 is of shape {list(a.shape)}: give a number or one value per action dimension ([{d}])",
        )
    return [float(x) for x in a]


def check_ou(module: Any, q_value: bool, action: Optional[Dict[str, Any]]) -> None:
    """Refuses, in one sentence naming what to change, an OU module the nodes cannot run as
    torchrl does: on a Q-value actor or a discrete action, reading another ``is_init`` or
    writing another action key, or clipping to bounds other than the env's (the nodes clip the
    noisy action to the env's box; torchrl to the module's spec when ``safe``)."""
    if q_value or (action is not None and action.get("kind") != "box"):
        kind = "a Q-value actor" if q_value else f"a {action.get('kind')} action"
        raise config_error("policy", f"OrnsteinUhlenbeckProcessModule adds noise to a continuous action, not to {kind}: use EGreedyModule")
    ou = module.ou
    key = ou.key if not (isinstance(ou.key, tuple) and len(ou.key) == 1) else ou.key[0]
    if key != "action":
        raise config_error("policy", f"OrnsteinUhlenbeckProcessModule acts on {ou.key!r}: rollout's nodes add the noise to `action`")
    if module.is_init_key not in ("is_init", ("is_init",)):
        raise config_error(
            "policy",
            f"OrnsteinUhlenbeckProcessModule resets its noise at {module.is_init_key!r}: rollout's nodes reset it at each episode's "
            "first frame, `is_init` (torchrl's InitTracker)",
        )
    if action is None:
        return
    from ._torch import _box_bounds  # the env's bounds as the nodes read them

    low, high = _box_bounds(action)
    spec = None
    if module.safe:
        try:
            spec = module.spec[ou.key]
        except (KeyError, TypeError):
            spec = None
    s_low, s_high = getattr(spec, "low", None), getattr(spec, "high", None)
    if s_low is None or s_high is None:
        m_low, m_high = np.full(len(low), -math.inf), np.full(len(low), math.inf)
    else:
        m_low = np.broadcast_to(s_low.detach().cpu().double().numpy(), (len(low),))
        m_high = np.broadcast_to(s_high.detach().cpu().double().numpy(), (len(low),))
    if not (np.allclose(m_low, low, atol=1e-6, equal_nan=False) and np.allclose(m_high, high, atol=1e-6)):
        how = "with safe=False it does not clip" if not module.safe else f"it clips to its spec's [{m_low.tolist()}, {m_high.tolist()}]"
        raise config_error(
            "policy",
            f"OrnsteinUhlenbeckProcessModule's actions are not bounded as the env's ({how}, the env's action is in "
            f"[{low.tolist()}, {high.tolist()}]): rollout's nodes clip the noisy action to the env's bounds, give the module the env's action spec",
        )


def ou_config(module: Any, eps_name: str, d: int) -> Dict[str, Any]:
    """The config's ``exploration`` of ``module`` for an action of ``d`` values, its ``eps``
    the model's initializer ``eps_name``. torchrl keeps ``m = -(sigma - sigma_min) /
    n_steps_annealing`` and, without ``sigma_min``, ``sigma_min = sigma`` and ``m = 0``:
    ``m = 0`` is written ``sigma_min: None`` (no annealing, the same sigma at every step),
    any other ``m`` gives back ``n_steps_annealing``."""
    ou = module.ou
    theta, mu, sigma, dt = (_scalar(n, getattr(ou, n)) for n in ("theta", "mu", "sigma", "dt"))
    m, smin = _scalar("m", ou.m), _scalar("sigma_min", ou.sigma_min)
    if dt <= 0:
        raise config_error("policy", f"OrnsteinUhlenbeckProcessModule's dt is {dt}: rollout's nodes take dt > 0")
    if sigma < 0 or smin < 0:
        raise config_error("policy", f"OrnsteinUhlenbeckProcessModule's sigma {sigma} and sigma_min {smin} must be >= 0")
    if m == 0.0:
        sigma_min, n_steps = None, _NO_ANNEALING
    else:
        n_steps = int(round((smin - sigma) / m))
        if n_steps < 1 or -(sigma - smin) / float(n_steps) != m:
            raise config_error("policy", "OrnsteinUhlenbeckProcessModule's sigma annealing is not one of n_steps_annealing >= 1 steps")
        sigma_min = smin
    return {
        "kind": "ornstein_uhlenbeck",
        "eps": eps_name,
        "theta": theta,
        "mu": mu,
        "sigma": sigma,
        "sigma_min": sigma_min,
        "n_steps_annealing": n_steps,
        "dt": dt,
        "x0": _x0(ou.x0, d),
    }


def ou_state(d: int) -> List[Tuple[str, Tuple[int, ...]]]:
    """The module's state tensors, as the config's ``state`` lists them (after the model's)."""
    return [(NOISE, (d,)), (STEPS, (1,))]


def eps_buffer_name(policy: Any, module: Any) -> str:
    """The ``state_dict`` name of ``module``'s ``eps`` buffer inside ``policy``."""
    for name, b in policy.named_buffers():
        if b is module.eps:
            return name
    raise config_error("policy", f"{type(module).__name__}'s eps is not a buffer of the actor")  # pragma: no cover


def with_eps_output(model: bytes, name: str, eps: float, output: str = EPS_OUTPUT) -> bytes:
    """``model`` with an f32 initializer ``name`` holding ``eps`` (shape ``[]``, as the
    buffer) and an ``Identity`` from it to a new output ``output``; checked with
    ``onnx.checker`` (a ConfigError on ``policy`` if it fails)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    proto = onnx.load_from_string(model)
    g = proto.graph
    taken = {t.name for t in g.initializer} | {o.name for o in g.output} | {i.name for i in g.input}
    for n in (name, output):
        if n in taken:
            raise config_error("policy", f"the exported model already has a tensor named `{n}`, which the exploration module's eps needs")
    g.initializer.append(numpy_helper.from_array(np.array(eps, dtype=np.float32), name))
    g.node.append(helper.make_node("Identity", [name], [output], name=f"{output}_identity"))
    g.output.append(helper.make_tensor_value_info(output, TensorProto.FLOAT, []))
    try:
        onnx.checker.check_model(proto)
    except Exception as e:  # onnx's ValidationError and friends
        raise config_error("policy", f"the model with the exploration module's eps does not check: {e}") from e
    return proto.SerializeToString()
