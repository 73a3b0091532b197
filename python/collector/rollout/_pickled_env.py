"""A torchrl env shipped to Python nodes as a cloudpickle (PROTOCOL.md §3, Pickled torchrl
env): the env spec it travels in, its bounds, and the nodes that can run it.

The spec is ``{name: PICKLED_ENV, config: {cloudpickle, python, exclude}}``: JSON, so it
goes through the Rust builder and the ``welcome`` frame as any env config. Loading it runs
this process's code, so Python nodes do so only when started with ``--allow-pickled-env``:
the nodes this collector starts itself get the flag; the ``rollout`` binary (a Rust node)
cannot run such an env and is refused here.
"""

from __future__ import annotations

import base64
import sys
from typing import Any, Dict, List, Optional, Tuple

from ._collector import _config_error as config_error
from ._collector import _require_rollout_node

#: The env name of a pickled torchrl env; ``rollout_node.torchrl_env.PICKLED_ENV`` (a test
#: keeps them equal).
PICKLED_ENV = "pickled-torchrl-env"
#: The largest pickle shipped (the nodes' ``MAX_PICKLE_BYTES``): 16 MiB, 22 MiB as base64 in
#: each node's ``welcome`` frame, under the default ``max_frame`` of 256 MiB.
MAX_PICKLE_BYTES = 16 << 20
#: The Python node's opt-in.
FLAG = "--allow-pickled-env"
#: What a ``welcome`` frame holds beside the pickle, at most, for :func:`check_fits`.
_SPARE = 1 << 20


def pickle_form(form: Any, env: Any, field: str, exclude: List[str], name: str) -> Tuple[str, dict, Optional[dict]]:
    """``(PICKLED_ENV, config, specs)`` of ``form`` (a function making ``env``, or ``env``
    itself; ``name`` names it in errors): refused when ``env`` is batched, when ``form``
    cannot be pickled or is over :data:`MAX_PICKLE_BYTES`, or (when ``rollout_node`` is here
    to read them) when its specs have no spaces the nodes collect."""
    if tuple(env.batch_size) != ():
        raise config_error(
            field,
            f"the env has batch_size {list(env.batch_size)}: give one env (a function making it), "
            "rollout's nodes run envs_per_node copies of it",
        )
    try:
        import cloudpickle
    except ImportError:
        raise config_error(field, f"a {type(env).__name__} goes to the nodes pickled: install cloudpickle (pip install cloudpickle)") from None
    try:
        blob = cloudpickle.dumps(form)
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise config_error(
            field,
            f"{name} cannot be pickled for the nodes ({type(e).__name__}: {first}); "
            "pass a function that builds the env, with nothing unpicklable in its closure",
        ) from None
    if len(blob) > MAX_PICKLE_BYTES:
        raise config_error(
            field,
            f"{name} is {len(blob)} bytes pickled, over {MAX_PICKLE_BYTES} (16 MiB): pass a function that builds "
            "the env and loads its data on the node, rather than one holding the data",
        )
    exclude = sorted(set(exclude))
    config = {
        "cloudpickle": base64.b64encode(blob).decode("ascii"),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "exclude": exclude,
    }
    return PICKLED_ENV, config, _specs(env, exclude, field)


def _specs(env: Any, exclude: List[str], field: str) -> Optional[dict]:
    """The env's spaces as the Python node will report them (read with ``rollout_node``'s
    own mapping), or None without ``rollout_node`` here; a ``ConfigError`` for specs the
    nodes cannot collect."""
    try:
        from rollout_node import spaces, torchrl_env
    except ImportError:
        return None
    from ._spaces import _space

    try:
        adapter = torchrl_env.TorchrlEnv(env, exclude)
        spaces.specs(adapter.observation_space, adapter.action_space)
    except (torchrl_env.PickledEnvError, spaces.SpaceError) as e:
        raise config_error(field, f"the {type(env).__name__} cannot be collected by rollout's nodes: {e}") from None
    obs, act = _space(adapter.observation_space), _space(adapter.action_space)
    return None if obs is None or act is None else {"observation": obs, "action": act}


def _each(forms: Any) -> list:
    """The resolved env forms (``_env_forms.resolve``) as a list, ids left out."""
    return [f for f in (forms if isinstance(forms, list) else [forms]) if not isinstance(f, str)]


def is_pickled(forms: Any) -> bool:
    """Whether any node's env is a pickled torchrl env."""
    return any(f[0] == PICKLED_ENV for f in _each(forms))


def specs_of(forms: Any) -> Optional[Dict[str, Any]]:
    """The spaces of the first pickled env among ``forms`` (None: none, or unread here)."""
    return next((f[3] for f in _each(forms) if f[0] == PICKLED_ENV), None)


def check_fits(forms: Any, max_frame: Any) -> None:
    """A node's ``welcome`` frame carries its pickled env (as base64) and must fit
    ``max_frame``, with 1 MiB to spare for the rest of the spec and the weights."""
    if not isinstance(max_frame, int) or isinstance(max_frame, bool):
        return  # None: the default 256 MiB holds the largest pickle; a bad value is the builder's to refuse
    largest = max((len(f[1]["cloudpickle"]) for f in _each(forms) if f[0] == PICKLED_ENV), default=0)
    if largest + _SPARE > max_frame:
        raise config_error(
            "max_frame",
            f"{max_frame} bytes cannot carry the pickled env ({largest} bytes as base64) in a node's welcome frame "
            f"with 1 MiB to spare: raise max_frame to at least {largest + _SPARE}",
        )


def node_command(field: str, launcher: str, command: Any, program: Any, min_nodes: Any, max_nodes: Any) -> Optional[list]:
    """The command of the nodes that run a pickled env: this interpreter's ``rollout_node``
    with :data:`FLAG` for the default launcher; ``None`` (nothing to change) for external
    nodes or a ``node_command``. A ``ConfigError`` for the ``rollout`` binary (a Rust node
    steps no torchrl env) and for a ``rollout_node`` command without the flag."""
    if command is not None:
        words = [str(w) for w in command]
        if any("rollout_node" in w or "rollout-node" in w for w in words) and FLAG not in words:
            raise config_error(
                "node_command",
                f"the {field} is a torchrl env the nodes get pickled, which rollout_node runs only with {FLAG}: add it to node_command",
            )
        return None
    if launcher == "external" or min_nodes is not None or max_nodes is not None:
        return None  # nodes that join (an elastic run is external: the builder says so otherwise)
    if launcher == "local" and program is None:
        _require_rollout_node("a torchrl env the nodes get pickled")
        return [sys.executable, "-m", "rollout_node", FLAG]
    raise config_error(
        field,
        f"a torchrl env the nodes get pickled runs on Python nodes only, not on the `rollout` binary the {launcher} launcher starts: "
        f'pass node_command=[sys.executable, "-m", "rollout_node", "{FLAG}"] (or leave the launcher as "local")',
    )
