"""``DistributedCollector``: torchrl's collector names over the Rust collector.

Arguments are checked here for their shape (names, JSON configs) and by the Rust
builder for their meaning; either way a bad one raises :class:`ConfigError`
whose ``field`` names the argument.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import sys
import tempfile
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _native
from ._batch import Batch

# Rust builder setting names that differ from this class's argument names.
_FIELD_NAMES = {"node_config": "collector_kwargs"}

# Every collector whose run was started and may still be running: shut down when the
# interpreter exits (a script that ends, or stops at a KeyboardInterrupt, without
# `shutdown()` or `with`), so that its nodes are told to stop and its threads joined,
# rather than torn down half-way as the process ends.
_LIVE: "weakref.WeakSet[DistributedCollector]" = weakref.WeakSet()
# A forked child inherits the objects but not the threads that run them: its exit leaves
# the parent's runs alone (shutting one down there would wait on a thread that is not there).
os.register_at_fork(after_in_child=_LIVE.clear)


@atexit.register
def _shutdown_live() -> None:
    for collector in list(_LIVE):
        try:
            collector.shutdown()
        except BaseException as e:  # noqa: BLE001 - the interpreter is exiting: say it, go on
            logging.getLogger("rollout").warning("shutting down %r at exit: %s: %s", collector, type(e).__name__, e)


def _config_error(field: str, reason: str) -> _native.ConfigError:
    err = _native.ConfigError(f"invalid `{field}`: {reason}")
    err.field = field
    return err


def _exploration(value: Any) -> Optional[str]:
    """torchrl's ``ExplorationType`` members, or their names, as a string."""
    if value is None:
        return None
    name = getattr(value, "name", value)
    if not isinstance(name, str):
        raise _config_error("exploration_type", f"expected a string or an ExplorationType, got {type(value).__name__}")
    return name.lower()


def _placed(forms: Any, field: str, env_config: Any, collector_kwargs: Any, nodes: Optional[int]):
    """(env, env_config, collector_kwargs, nodes) for torchrl's env forms resolved by
    ``_env_forms.resolve``: one env for every node, or one per node."""
    if isinstance(forms, str):
        return forms, env_config, collector_kwargs, nodes
    many = isinstance(forms, list)
    forms = [f[:2] for f in forms] if many else forms[:2]
    first = forms[0] if many else forms
    if first[1] is not None and env_config is not None:
        if "cloudpickle" in first[1]:  # a pickled torchrl env's config (_pickled_env)
            raise _config_error("env_config", f"the {field} given is a torchrl env the nodes get pickled: gym.make's keyword arguments do not apply, leave env_config out")
        raise _config_error("env_config", f"the {field} given already has gym.make's keyword arguments: give them once")
    config = first[1] if first[1] is not None else env_config
    if not many:
        return first[0], config, collector_kwargs, nodes
    if nodes is None:
        nodes = len(forms)
    elif nodes != len(forms):
        raise _config_error(field, f"{len(forms)} envs for {nodes} nodes: give one per node (torchrl: one per collector)")
    if all(f == first for f in forms):
        return first[0], config, collector_kwargs, nodes
    if collector_kwargs is not None:
        raise _config_error("collector_kwargs", f"the nodes' envs differ in {field}: give per-node envs there or in collector_kwargs, not both")
    per_node = [{"env": name, **({"env_config": cfg} if cfg is not None else {})} for name, cfg in forms]
    return first[0], config, per_node, nodes


def _added_entries(forms: Any, field: str) -> tuple:
    """The entries the env forms' transforms add (the same for every node)."""
    if isinstance(forms, str):
        return ()
    each = {f[2] for f in forms} if isinstance(forms, list) else {forms[2]}
    if len(each) > 1:
        raise _config_error(field, "the nodes' envs have different transforms: give every node the same ones")
    return each.pop()


def _check_primed(primed: tuple, policy: Any, field: str) -> None:
    """A ``TensorDictPrimer`` on the env primes the recurrent actor's state, which the
    nodes keep: each of its keys must be a state tensor of the exported actor."""
    if not primed:
        return
    state = {name for name, _ in policy.state} if policy is not None else set()
    for key in primed:
        if key not in state:
            has = f"the actor's state is {sorted(state)}" if state else "the policy keeps no state"
            raise _config_error(
                field,
                f"the env's TensorDictPrimer primes `{key}`, which is not a state of the actor's recurrent module "
                f"({has}): rollout's nodes keep the state themselves, leave the primer out or prime the actor's keys",
            )


def _cpu_only(field: str, device: Any) -> None:
    """torchrl's device arguments: the CPU (or ``None``) is what nodes run on."""
    if device is None:
        return
    name = getattr(device, "type", device)
    if not isinstance(name, str):
        raise _config_error(field, f"a device such as \"cpu\", got {type(device).__name__}")
    if name.split(":")[0] != "cpu":
        raise _config_error(
            field, f"{device!s}: rollout's nodes run policies and store batches on the CPU; pass \"cpu\" or leave it out"
        )


def _ray_plan(pickled, min_nodes, max_nodes, node_command, node_program, token, listen, advertise, actor_options,
              tls_ca, tls_server_name, node_tls_cert, node_tls_key):
    """``launcher="ray"``: the node program's words with its TLS flags and the address it
    joins, the token (drawn when none was given: the actors hand it to their nodes) and
    the trainer's listen address (a free loopback port when none was given)."""
    import secrets

    from ._ray import free_address

    if pickled:
        raise _config_error("launcher", 'a pickled torchrl env is served by Python nodes the "process" launcher starts, not "ray"')
    if min_nodes is not None or max_nodes is not None:
        raise _config_error("launcher", '"ray" starts a fixed set of nodes: give nodes, not min_nodes or max_nodes')
    if actor_options is not None and not isinstance(actor_options, Mapping):
        raise _config_error("ray_actor_options", f"a dict of Ray actor options (num_cpus, resources, ...), got {type(actor_options).__name__}")
    try:
        import ray  # noqa: F401
    except ImportError:
        raise _config_error("launcher", '"ray" needs Ray in this interpreter: pip install "ray>=2.40"') from None
    if actor_options is not None:
        from ._ray import check_actor_options

        try:
            check_actor_options(actor_options)
        except (TypeError, ValueError) as e:
            raise _config_error("ray_actor_options", f"Ray refuses them: {e}") from None
    argv = list(node_command) if node_command is not None else [os.fspath(node_program), "node"]
    if tls_ca is not None:
        argv += ["--tls-ca", os.fspath(tls_ca)]
        if tls_server_name is not None:
            argv += ["--tls-server-name", tls_server_name]
        if node_tls_cert is not None or node_tls_key is not None:
            argv += ["--tls-cert", os.fspath(node_tls_cert), "--tls-key", os.fspath(node_tls_key)]
    if token is None:
        token = secrets.token_hex(32).encode()
    if listen is None:
        listen = free_address()
    return (argv, advertise or listen), token, listen


def _needs_python_nodes(env: Any, env_config: Any, launcher: str, node_command: Any, node_program: Any, min_nodes: Any, max_nodes: Any) -> bool:
    """An env id no built-in env has, with nothing said about how to start nodes: it is
    served by Python nodes this collector starts (gymnasium's envs, and any the
    rollout_node package can import)."""
    if not isinstance(env, str) or launcher != "local" or node_command is not None or node_program is not None:
        return False
    if min_nodes is not None or max_nodes is not None:
        return False  # elastic runs take nodes that join: the builder says so
    return _native.builtin_env_specs(env, _env_config("env_config", env_config)) is None


def _require_rollout_node(what: str) -> None:
    """A ``ConfigError`` saying what to install when this interpreter has no ``rollout_node``
    to run ``what`` (an env no built-in env is)."""
    import importlib.util

    if importlib.util.find_spec("rollout_node") is None:
        raise _config_error(
            "env",
            f"{what} is not a built-in env (CartPole-v1, Pendulum-v1, MountainCarContinuous-v0, Counting); "
            "other envs run on Python nodes: install the rollout-node package (pip install ./python/node) "
            "in this interpreter, or pass node_command",
        )


def _python_node_command(env: str) -> list:
    """This interpreter running ``rollout_node``, or a ``ConfigError`` saying what to install."""
    import importlib.util

    _require_rollout_node(repr(env))
    if env.startswith("envpool:"):  # the Python node's EnvPool backend (docs/python-node.md)
        if importlib.util.find_spec("envpool") is None:
            raise _config_error("env", f"{env!r} is an EnvPool env: install envpool (pip install envpool) in this interpreter")
        return [sys.executable, "-m", "rollout_node"]
    if env.startswith("pettingzoo:"):  # the Python node's PettingZoo backend (docs/python-node.md)
        module = env[len("pettingzoo:") :].partition(":")[0]
        for needed in ("pettingzoo", module.split(".")[0]):
            if not needed or importlib.util.find_spec(needed) is None:
                raise _config_error("env", f"{env!r} is a PettingZoo env: install {needed or 'its module'} in this interpreter")
        return [sys.executable, "-m", "rollout_node"]
    try:
        import gymnasium
    except ImportError:
        gymnasium = None
    if gymnasium is not None:
        if env.startswith("ALE/") and env not in gymnasium.registry:
            try:  # Atari ids are ale-py's, registered by importing it (as the node does)
                import ale_py

                gymnasium.register_envs(ale_py)
            except ImportError:
                pass  # gymnasium's error below says what is missing
        try:
            gymnasium.spec(env)
        except Exception as e:  # gymnasium's own error types differ across versions
            raise _config_error(
                "env",
                f"{env!r} is neither a built-in env (CartPole-v1, Pendulum-v1, MountainCarContinuous-v0, Counting) "
                f"nor one gymnasium knows ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "for an env of your own, pass node_command with rollout_node's --import",
            ) from None
    return [sys.executable, "-m", "rollout_node"]


def _is_torch(policy: Any) -> bool:
    """A torch module, told without importing torch (it is imported when it is used)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(policy, torch.nn.Module)


def _env_specs(
    env: Optional[str], env_config: Any, env_spec: Any, why: Optional[List[str]] = None
) -> Optional[Dict[str, Any]]:
    """The env's spaces before any node runs, when they can be known: ``env_spec``,
    a built-in env's, or gymnasium's spaces for a gymnasium id (``None`` otherwise, and
    why appended to ``why`` when gymnasium could not make the env)."""
    if env_spec is not None:
        return dict(env_spec)
    if env is None:
        return None
    config = _env_config("env_config", env_config)
    native = _native.builtin_env_specs(env, config)
    if native is not None:
        return json.loads(native)
    from ._spaces import PETTINGZOO, gymnasium_specs, pettingzoo_specs

    if env.startswith(PETTINGZOO):
        return pettingzoo_specs(env, env_config)
    return gymnasium_specs(env, env_config, why)


def _policy(policy: Any) -> Optional[str]:
    """A policy config as JSON: a kind (``"linear"``) or a dict (``{"kind": "mlp", "hidden": [64]}``)."""
    if policy is None:
        return None
    if isinstance(policy, str):
        return json.dumps({"kind": policy})
    if isinstance(policy, Mapping):
        return json.dumps(dict(policy))
    raise _config_error("policy", f"expected a policy kind or a config dict, got {type(policy).__name__}")


def _env_config(field: str, config: Any) -> Optional[str]:
    if config is None:
        return None
    try:
        return json.dumps(config)
    except (TypeError, ValueError) as e:
        raise _config_error(field, f"not JSON-serializable: {e}") from None


def _node_configs(configs: Any) -> Optional[list]:
    """``collector_kwargs``: one dict for every node, or a list with one per node."""
    if configs is None:
        return None
    if isinstance(configs, Mapping):
        raise _config_error("collector_kwargs", "give a list with one dict per node (a single dict is what every node already gets from the other arguments)")
    out = []
    for c in configs:
        if not isinstance(c, Mapping):
            raise _config_error("collector_kwargs", f"expected one dict per node, got {type(c).__name__}")
        c = dict(c)
        if "num_workers" in c:
            c["envs_per_node"] = c.pop("num_workers")
        if "exploration_type" in c:
            c["exploration_type"] = _exploration(c["exploration_type"])
        if "env_config" in c:
            c["env_config"] = _env_config("collector_kwargs", c["env_config"])
        out.append(c)
    return out


def _weights(weights: Mapping[str, Any]) -> Dict[str, np.ndarray]:
    """Names to NumPy arrays: anything with ``__array__`` (torch tensors are detached first)."""
    if hasattr(weights, "state_dict") and not isinstance(weights, Mapping):
        weights = weights.state_dict()
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights: expected a mapping of names to arrays, got {type(weights).__name__}")
    out = {}
    for name, value in weights.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu()
        out[name] = np.asarray(value)
    return out


def _worker_ids(ids: Union[None, int, Iterable[int]], nodes: int) -> Optional[list]:
    """``worker_ids`` as a list of node indices, each checked against the run's nodes
    (before anything is stored)."""
    if ids is None:
        return None
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        ids = [ids]
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise _config_error("worker_ids", f"node indices are ints, got {type(i).__name__} {i!r}")
        if not 0 <= int(i) < nodes:
            raise _config_error("worker_ids", f"no node {int(i)}: the run has nodes 0..{nodes - 1}")
        out.append(int(i))
    return out


def _checkpoint(resume: Any) -> Any:
    """The checkpoint bytes of ``resume`` (a :meth:`DistributedCollector.state_dict`,
    or its bytes); the native side decodes and checks them."""
    if isinstance(resume, Mapping):
        if "checkpoint" not in resume:
            raise _config_error("resume", f"a state_dict() has the key `checkpoint`; got keys {sorted(map(str, resume))}")
        resume = resume["checkpoint"]
    if not isinstance(resume, (bytes, bytearray, memoryview)):
        raise _config_error("resume", f"checkpoint bytes (state_dict()[\"checkpoint\"]), got {type(resume).__name__}")
    return bytes(resume)


def _node_command(command: Any) -> list:
    """``node_command`` as a list of words: a sequence of strings or paths, not one string."""
    if isinstance(command, (str, bytes)):
        raise _config_error(
            "node_command",
            "a list of words, program first, e.g. [sys.executable, '-m', 'rollout_node'] "
            "(shlex.split(...) splits a command line)",
        )
    try:
        return [os.fspath(w) for w in command]
    except TypeError:
        raise _config_error("node_command", f"a list of strings, got {command!r}") from None



def _path(p: Any) -> Any:
    """A path argument as the builder reads it: a ``PathLike`` as its string, anything
    else as it is (a wrong type is the builder's ConfigError naming the argument)."""
    return os.fspath(p) if isinstance(p, os.PathLike) else p

class DistributedCollector:
    """Collects batches of env frames on rollout's nodes, as torchrl's collectors do.

    Iterate it (or call :meth:`next`) for batches: ``tensordict.TensorDict`` s laid out
    as torchrl's when the policy is a torch module (or ``tensordict=True``), else
    :class:`Batch` es of NumPy arrays; both view the buffers the nodes collected into.
    Push weights back with :meth:`update_policy_weights_`. Use it in a ``with`` block
    (or call :meth:`shutdown`). A bad argument raises :class:`ConfigError` naming it,
    before anything starts.

    Example (torchrl's PPO actor on CartPole, two local nodes)::

        import torch
        from tensordict.nn import TensorDictModule
        from torchrl.modules import OneHotCategorical, ProbabilisticActor
        import rollout

        actor = ProbabilisticActor(
            TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"]),
            in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True,
        )
        with rollout.DistributedCollector("CartPole-v1", actor, frames_per_batch=200,
                                          total_frames=1000, nodes=2, seed=0) as collector:
            for data in collector:  # a TensorDict of 200 frames from one node
                assert data["action_log_prob"].shape == data.batch_size
                collector.update_policy_weights_()  # the actor's current parameters

    Built-in envs (stepped in Rust): ``CartPole-v1``, ``Pendulum-v1``,
    ``MountainCarContinuous-v0``, ``Counting``; any other id runs on Python nodes
    (``rollout_node``, gymnasium's envs and any it can import; ``envpool:<task>``, e.g.
    ``envpool:Pong-v5``, EnvPool's, with ``env_config`` its ``envpool.make`` arguments).

    Args (torchrl's names; ``None`` leaves the default said here):
        ``env`` / ``create_env_fn``: the env: an id, or torchrl's forms (a ``GymEnv``, a
            ``TransformedEnv`` over one with ``StepCounter``, a function or ``EnvCreator``
            making one, a list of them, one per node; any other torchrl env goes to Python
            nodes cloudpickled, run with ``--allow-pickled-env``). Required.
        ``policy``: a torch actor (``nn.Module``, ``TensorDictModule``,
            ``ProbabilisticActor``), a kind (``"random"``, ``"linear"``, ``"mlp"``,
            ``"constant"``, ``"onnx"``) or a config dict. Default ``"linear"``.
        ``frames_per_batch``: frames per batch. Required.
        ``total_frames``: frames in all; -1 (default) collects until shut down.
        ``env_config``: ``gym.make`` keyword arguments (a JSON-able dict).
        ``env_spec``: the env's spaces declared (PROTOCOL.md section 3); nodes must match.
        ``nodes``: number of nodes (1). ``min_nodes``, ``max_nodes``: an elastic run
            instead (async, ``launcher="external"``; ``min_nodes`` 1).
        ``envs_per_node`` / ``num_workers_per_collector``: envs per node (1).
        ``envs_per_worker``: envs one worker thread steps together (1).
        ``sync``: every batch stacks a share of every node (False: async).
        ``seed``: the run's seed (drawn from the clock). ``policy_init_seed``: the seed
            of a built-in policy's initial weights (0).
        ``launcher``: ``"local"`` (default: threads of this process), ``"process"``,
            ``"external"``, ``"slurm"``, ``"ray"``; ``slurm_kwargs``: ``partition``, ``time``,
            ``cpus_per_task``, ``mem``, ``extra_lines``, ``job_name``, ``output_dir``.
            ``"ray"``: each node a Ray actor running the node program, joining over TCP
            (``ray_address``: the Ray cluster, default the one this process is connected
            to or a new local one; ``ray_actor_options``: each node actor's options, e.g.
            ``{"num_cpus": 2}``, default one CPU, spread over the cluster's nodes); a node
            actor that dies is replaced, its slot waiting for it (``node_max_restarts``,
            default 5 here); the trainer listens on ``listen`` (default a free loopback
            port: give a cluster address for Ray nodes on other hosts).
        ``collector_kwargs``: one dict per node (``env``, ``env_config``,
            ``envs_per_node``, ``exploration_type``).
        ``node_program``: the ``rollout`` binary the process and SLURM launchers start
            (``$ROLLOUT_BIN`` or ``rollout`` on ``PATH``; without one, the same Rust node
            from this package, ``python -m rollout node``); ``node_command``: instead, the
            words of any command starting a node, e.g.
            ``[sys.executable, "-m", "rollout_node"]``.
        ``update_after_each_batch`` (False), ``max_weight_update_interval`` (never),
            ``update_interval`` (never): when stored weights go to the nodes.
        ``max_policy_lag`` (async; no cap): a batch whose weights are more than this many
            versions behind the stored ones when it would be yielded is dropped (counted;
            its node gets the stored weights and collects it again; ``total_frames``
            counts delivered frames only), or, with ``deliver_lagging`` (False) true,
            delivered with ``batch.lagging`` set. Every batch says its ``policy_lag``.
        ``prefetch`` (async; 0): batches each node collects ahead of the consumer. 0 is
            torchrl's semantics (a node goes on once its batch is taken); 1 removes the
            wait for the hand-over, at the price of frames one batch staler (see
            ``policy_lag`` and ``max_policy_lag``).
        ``max_frames_per_traj``: truncate longer trajectories (no limit).
        ``done_on_any``: multi-agent envs end an episode once any agent is done (torchrl's
            ``PettingZooWrapper(done_on_any=True)``), not once every agent is; default: the
            env's ``PettingZooWrapper``'s own, False for an env named by id.
        ``init_random_frames``: frames of a random policy first (0).
        ``reset_at_each_iter``: fresh episodes for each batch (False).
        ``split_trajs``: batches as ``[trajectories, max_len]`` with a mask (False).
        ``exploration_type``: ``"random"`` (default) or ``"deterministic"``
            (``"mode"``, ``"mean"``), or torchrl's ``ExplorationType``.
        ``record``: whether batches carry what the policy records beside its actions
            (``action_log_prob`` and its distribution's parameters); ``None`` (default):
            when the nodes sample their actions, not when they act deterministically.
        ``postproc``: called on each batch before it is yielded.
        Every other argument of torchrl's collectors (``track_policy_version``,
        ``reset_when_done``, ``compile_policy``, ``replay_buffer``, ...) is taken too:
        ``track_policy_version=True`` writes ``policy_version`` (the weights version of each
        frame) into TensorDict batches; the others are accepted where their value changes
        nothing here (torchrl's default, or a knob of torchrl's own loop such as
        ``use_buffers``) and refused in one sentence otherwise (``ConfigError`` naming the
        argument); ``torchrl_kwargs`` holds them: ``auto_register_policy_transforms``,
        ``backend``, ``backend_options``, ``compact_obs``, ``compile_policy``,
        ``create_env_kwargs``, ``cudagraph_policy``, ``extend_buffer``, ``interruptor``,
        ``local_init_rb``, ``no_cuda_sync``, ``num_collectors``, ``policy_factory``,
        ``post_collect_hook``, ``pre_collect_hook``, ``replay_buffer``, ``reset_when_done``,
        ``return_same_td``, ``set_truncated``, ``track_policy_version``, ``track_traj_ids``,
        ``traj_format``, ``trajs_per_batch``, ``trajs_per_write``, ``trust_policy``,
        ``use_buffers``, ``weight_recv_schemes``, ``weight_sync_schemes``,
        ``weight_updater``, ``worker_idx``.
        ``device``, ``policy_device``, ``storing_device``, ``env_device``: the CPU (or
            ``None``); another device is refused.
        ``policy_file``, ``onnx_head``: the ``.onnx`` model and head of
            ``policy="onnx"``.
        ``tensordict``: TensorDict batches (default: when the policy is a torch module).
        ``resume``: a :meth:`state_dict` to go on from.
        ``nan_is_failure`` (False), ``allow_nonfinite_weights`` (False).
        Supervision: ``max_restarts`` (5) within ``restart_window`` (5 s) per env
            worker; ``node_max_restarts`` within ``node_restart_window`` (5 s) per node
            (off unless set); ``continue_without_lost_nodes`` (False); ``worker_nice``
            (10).
        Deadlines in seconds: ``batch_timeout`` (60, or twice the longest answer
            deadline set), ``request_timeout`` (30, or half of ``batch_timeout``),
            ``seed_timeout``, ``update_weights_timeout``, ``snapshot_timeout`` (each
            ``request_timeout``), ``continue_timeout`` (none), ``shutdown_timeout`` (10),
            ``shutdown_ack_timeout`` (half of it), ``join_timeout`` (60),
            ``heartbeat`` (1), ``heartbeat_timeout`` (5), ``handshake_timeout`` (5).
        Remote nodes: ``listen`` (``"127.0.0.1:0"``), ``advertise`` (SLURM), ``token``
            (at least 16 bytes; drawn at random for nodes this collector starts),
            ``max_frame`` (256 MiB).
        TLS on every node's link (paths of PEM files; off: plain TCP): ``tls_cert`` and
            ``tls_key`` (the trainer's certificate and key), ``tls_client_ca`` (mutual TLS:
            the CA node certificates must chain to); for the nodes this collector starts
            (``launcher="process"``, ``"slurm"``): ``tls_ca`` (the CA they check the
            trainer against; required with ``tls_cert`` there), ``tls_server_name``,
            ``node_tls_cert`` and ``node_tls_key`` (theirs, under mutual TLS).
        Metrics: ``metrics`` (``"HOST:PORT"``, off), ``metrics_linger`` (0 s).

    See docs/python.md for each in full.
    """

    def __init__(
        self,
        env: Any = None,
        policy: Any = None,
        *,
        frames_per_batch: Optional[int] = None,
        total_frames: int = -1,
        create_env_fn: Any = None,
        env_config: Optional[Mapping[str, Any]] = None,
        env_spec: Optional[Mapping[str, Any]] = None,
        nodes: Optional[int] = None,
        envs_per_node: Optional[int] = None,
        num_workers_per_collector: Optional[int] = None,
        envs_per_worker: Optional[int] = None,
        sync: bool = False,
        seed: Optional[int] = None,
        launcher: str = "local",
        slurm_kwargs: Optional[Mapping[str, Any]] = None,
        ray_address: Optional[str] = None,
        ray_actor_options: Optional[Mapping[str, Any]] = None,
        collector_kwargs: Optional[Sequence[Mapping[str, Any]]] = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: Optional[int] = None,
        update_interval: Optional[int] = None,
        max_policy_lag: Optional[int] = None,
        deliver_lagging: bool = False,
        prefetch: Optional[int] = None,
        max_frames_per_traj: Optional[int] = None,
        done_on_any: Optional[bool] = None,
        init_random_frames: Optional[int] = None,
        reset_at_each_iter: bool = False,
        split_trajs: bool = False,
        exploration_type: Any = None,
        record: Optional[bool] = None,
        node_program: Optional[str] = None,
        node_command: Optional[Sequence[str]] = None,
        resume: Optional[Mapping[str, Any]] = None,
        policy_init_seed: Optional[int] = None,
        policy_file: Optional[str] = None,
        onnx_head: Optional[str] = None,
        min_nodes: Optional[int] = None,
        max_nodes: Optional[int] = None,
        nan_is_failure: Optional[bool] = None,
        allow_nonfinite_weights: Optional[bool] = None,
        max_restarts: Optional[int] = None,
        restart_window: Optional[float] = None,
        node_max_restarts: Optional[int] = None,
        node_restart_window: Optional[float] = None,
        continue_timeout: Optional[float] = None,
        continue_without_lost_nodes: Optional[bool] = None,
        worker_nice: Optional[int] = None,
        batch_timeout: Optional[float] = None,
        request_timeout: Optional[float] = None,
        seed_timeout: Optional[float] = None,
        update_weights_timeout: Optional[float] = None,
        snapshot_timeout: Optional[float] = None,
        shutdown_timeout: Optional[float] = None,
        shutdown_ack_timeout: Optional[float] = None,
        join_timeout: Optional[float] = None,
        heartbeat: Optional[float] = None,
        heartbeat_timeout: Optional[float] = None,
        handshake_timeout: Optional[float] = None,
        listen: Optional[str] = None,
        advertise: Optional[str] = None,
        token: Union[None, str, bytes] = None,
        max_frame: Optional[int] = None,
        tls_cert: Union[None, str, "os.PathLike[str]"] = None,
        tls_key: Union[None, str, "os.PathLike[str]"] = None,
        tls_client_ca: Union[None, str, "os.PathLike[str]"] = None,
        tls_ca: Union[None, str, "os.PathLike[str]"] = None,
        tls_server_name: Optional[str] = None,
        node_tls_cert: Union[None, str, "os.PathLike[str]"] = None,
        node_tls_key: Union[None, str, "os.PathLike[str]"] = None,
        metrics: Optional[str] = None,
        metrics_linger: Optional[float] = None,
        tensordict: Optional[bool] = None,
        device: Any = None,
        policy_device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        postproc: Optional[Callable[[Any], Any]] = None,
        **torchrl_kwargs: Any,
    ) -> None:
        from . import _torchrl_args

        self._policy_version = _torchrl_args.check("DistributedCollector.__init__", torchrl_kwargs)
        self._policy_given = policy  # the `policy` property: what the user passed
        for name, value in (("device", device), ("policy_device", policy_device), ("storing_device", storing_device), ("env_device", env_device)):
            _cpu_only(name, value)
        if postproc is not None and not callable(postproc):
            raise _config_error("postproc", f"a callable taking a batch and returning one, got {type(postproc).__name__}")
        self._postproc = postproc
        if env is not None and create_env_fn is not None:
            raise _config_error("env", "give env or create_env_fn, not both")
        env_field = "env" if env is not None else "create_env_fn"
        added: tuple = ()
        primed: tuple = ()
        agent_masks = True
        wrapper_on_any = None
        pickled, pickled_specs = False, None
        env = env if env is not None else create_env_fn
        if env is not None and not isinstance(env, str):
            from . import _pickled_env
            from ._env_forms import DONE_ON_ALL, DONE_ON_ANY, NO_AGENT_MASKS, PRIMED, resolve

            forms = resolve(env, env_field)
            pickled, pickled_specs = _pickled_env.is_pickled(forms), _pickled_env.specs_of(forms)
            if pickled:
                _pickled_env.check_fits(forms, max_frame)
            added = _added_entries(forms, env_field)
            primed = tuple(a[len(PRIMED) :] for a in added if a.startswith(PRIMED))
            added = tuple(a for a in added if not a.startswith(PRIMED))
            if NO_AGENT_MASKS in added:
                added = tuple(a for a in added if a != NO_AGENT_MASKS)
                agent_masks = False
            # A PettingZooWrapper's done_on_any (torchrl's default for a parallel env: True),
            # which the nodes follow; None for any other env.
            if DONE_ON_ANY in added or DONE_ON_ALL in added:
                wrapper_on_any = DONE_ON_ANY in added
            added = tuple(a for a in added if a not in (DONE_ON_ANY, DONE_ON_ALL))
            env, env_config, collector_kwargs, nodes = _placed(forms, env_field, env_config, collector_kwargs, nodes)
        if done_on_any is not None and not isinstance(done_on_any, bool):
            raise _config_error("done_on_any", f"expected a bool, got {type(done_on_any).__name__}")
        if wrapper_on_any is not None and done_on_any is not None and done_on_any != wrapper_on_any:
            raise _config_error(
                "done_on_any",
                f"{done_on_any} contradicts the env's PettingZooWrapper(done_on_any={wrapper_on_any}): give it in one place",
            )
        done_on_any = bool(done_on_any if done_on_any is not None else wrapper_on_any)
        if envs_per_node is not None and num_workers_per_collector is not None:
            raise _config_error("envs_per_node", "give envs_per_node or num_workers_per_collector, not both")
        if envs_per_node is None:
            envs_per_node = num_workers_per_collector
        if max_weight_update_interval is not None and max_weight_update_interval < 0:
            max_weight_update_interval = None  # torchrl's -1: never
        if max_frames_per_traj is not None and max_frames_per_traj < 0:
            max_frames_per_traj = None  # torchrl's -1: no limit
        if init_random_frames is not None and init_random_frames < 0:
            init_random_frames = None
        if node_command is not None:
            if node_program is not None:
                raise _config_error("node_command", "give node_program or node_command, not both")
            node_command = _node_command(node_command)
        elif launcher in ("process", "slurm", "ray") and node_program is None and not pickled:
            node_program = os.environ.get("ROLLOUT_BIN") or shutil.which("rollout")
            if node_program is None:
                # No binary: the same Rust node from this package's extension.
                node_command = [sys.executable, "-m", "rollout", "node"]
        if pickled:
            from ._pickled_env import node_command as pickled_node_command

            command = pickled_node_command(env_field, launcher, node_command, node_program, min_nodes, max_nodes)
            if command is not None:
                launcher, node_command = "process", command
        elif _needs_python_nodes(env, env_config, launcher, node_command, node_program, min_nodes, max_nodes):
            launcher, node_command = "process", _python_node_command(env)
        if isinstance(token, str):
            token = token.encode()
        ray_plan = None
        if launcher == "ray":
            ray_plan, token, listen = _ray_plan(
                pickled, min_nodes, max_nodes, node_command, node_program, token, listen, advertise, ray_actor_options,
                tls_ca, tls_server_name, node_tls_cert, node_tls_key,
            )
            launcher, node_command, node_program = "external", None, None
            tls_ca = tls_server_name = node_tls_cert = node_tls_key = None
            if node_max_restarts is None:
                # Supervised: a lost node's slot waits for the actor that replaces it.
                node_max_restarts = 5
        elif ray_address is not None or ray_actor_options is not None:
            raise _config_error("ray_address" if ray_address is not None else "ray_actor_options", 'only with launcher="ray"')
        self._ray_nodes: Any = None
        self._torch_policy = None
        self._onnx_model: Optional[bytes] = None
        if _is_torch(policy):
            from ._torch import export_policy

            unknown: List[str] = []
            specs = (
                pickled_specs
                if env_spec is None and pickled_specs is not None
                else _env_specs(env, env_config, env_spec, unknown)
            )
            exploration = _exploration(exploration_type)
            try:
                self._torch_policy = export_policy(policy, specs, exploration)
            except _native.ConfigError as e:
                if getattr(e, "guessed", False) and unknown:
                    # The policy failed on a guessed observation: say why the env's spaces were unknown.
                    raise _config_error("policy", f"{str(e).split(': ', 1)[-1]}; {unknown[0]}; make the env here or give env_spec") from e
                raise
            self._onnx_model = self._torch_policy.model
            policy = {"kind": "onnx"}
            if self._torch_policy.exploration is not None:
                # The module the nodes run after the model (PROTOCOL.md §8), and the whole
                # state list: the model's tensors, then the module's.
                policy["exploration"] = self._torch_policy.exploration
                policy["state"] = [{"name": n, "shape": list(s)} for n, s in self._torch_policy.state]
        _check_primed(primed, self._torch_policy, env_field)
        if tensordict is None:
            tensordict = self._torch_policy is not None or bool(added)
        if added and not tensordict:
            raise _config_error("tensordict", f"{', '.join(added)} of the env's transforms is written into TensorDict batches: leave tensordict on")
        if tensordict:
            from . import _tensordict  # noqa: F401 - a missing torch/tensordict is said now
        self._tensordict = bool(tensordict)
        self._init_tracker = "is_init" in added
        self._agent_masks = agent_masks
        self._episode_reward = None
        if "episode_reward" in added:
            from ._tensordict import EpisodeReward

            self._episode_reward = EpisodeReward()
        checkpoint = None
        if resume is not None:
            checkpoint = _checkpoint(resume)
        settings: Dict[str, Any] = dict(
            env=env,
            env_config=_env_config("env_config", env_config),
            env_spec=_env_config("env_spec", env_spec),
            policy=_policy(policy),
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            nodes=nodes,
            envs_per_node=envs_per_node,
            envs_per_worker=envs_per_worker,
            sync=sync,
            seed=seed,
            launcher=launcher,
            slurm_kwargs=dict(slurm_kwargs) if slurm_kwargs is not None else None,
            collector_kwargs=_node_configs(collector_kwargs),
            update_after_each_batch=update_after_each_batch,
            max_weight_update_interval=max_weight_update_interval,
            update_interval=update_interval,
            max_policy_lag=max_policy_lag,
            deliver_lagging=deliver_lagging,
            prefetch=prefetch,
            max_frames_per_traj=max_frames_per_traj,
            done_on_any=done_on_any,
            init_random_frames=init_random_frames,
            reset_at_each_iter=reset_at_each_iter,
            split_trajs=split_trajs,
            exploration_type=_exploration(exploration_type),
            record=record,
            node_program=os.fspath(node_program) if isinstance(node_program, os.PathLike) else node_program,
            node_command=node_command,
            token=token,
            resume=checkpoint,
            policy_init_seed=policy_init_seed,
            policy_file=os.fspath(policy_file) if policy_file is not None else None,
            onnx_head=onnx_head,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            nan_is_failure=nan_is_failure,
            allow_nonfinite_weights=allow_nonfinite_weights,
            max_restarts=max_restarts,
            restart_window=restart_window,
            node_max_restarts=node_max_restarts,
            node_restart_window=node_restart_window,
            continue_timeout=continue_timeout,
            continue_without_lost_nodes=continue_without_lost_nodes,
            worker_nice=worker_nice,
            batch_timeout=batch_timeout,
            request_timeout=request_timeout,
            seed_timeout=seed_timeout,
            update_weights_timeout=update_weights_timeout,
            snapshot_timeout=snapshot_timeout,
            shutdown_timeout=shutdown_timeout,
            shutdown_ack_timeout=shutdown_ack_timeout,
            join_timeout=join_timeout,
            heartbeat=heartbeat,
            heartbeat_timeout=heartbeat_timeout,
            handshake_timeout=handshake_timeout,
            listen=listen,
            advertise=advertise,
            max_frame=max_frame,
            tls_cert=_path(tls_cert),
            tls_key=_path(tls_key),
            tls_client_ca=_path(tls_client_ca),
            tls_ca=_path(tls_ca),
            tls_server_name=tls_server_name,
            node_tls_cert=_path(node_tls_cert),
            node_tls_key=_path(node_tls_key),
            metrics=metrics,
            metrics_linger=metrics_linger,
        )
        if self._torch_policy is not None:
            # The exported model: its file is written when the run starts (`_start`).
            if settings.get("policy_file") is not None or settings.get("onnx_head") is not None:
                raise _config_error("policy_file", "a torch policy is exported by the collector: give the module or a file, not both")
            settings["onnx_head"] = self._torch_policy.head
        # Unset settings are left to the Rust builder's defaults (documented there).
        settings = {k: v for k, v in settings.items() if v is not None}
        self._settings = {k: v for k, v in settings.items() if k != "resume"}
        if ray_plan is not None:
            from ._ray import RayNodes

            argv, join = ray_plan
            # Started first: they join as the trainer comes up (the constructor waits for them).
            self._ray_nodes = RayNodes(
                argv, join, token, nodes or 1, address=ray_address, actor_options=ray_actor_options,
                max_replacements=node_max_restarts,
            )
        try:
            self._native = self._start(settings)
        except BaseException:
            if self._ray_nodes is not None:
                self._ray_nodes.stop()
            raise

    def _start(self, settings: Dict[str, Any]) -> "_native.NativeCollector":
        # The `rollout` logger's level as it is now decides which Rust events are formatted.
        _native.refresh_log_levels()
        with tempfile.TemporaryDirectory(prefix="rollout-policy-") as tmp:
            if self._onnx_model is not None:
                # The builder reads the model file once, now; the file goes with `tmp`.
                settings = dict(settings, policy_file=os.path.join(tmp, "policy.onnx"))
                with open(settings["policy_file"], "wb") as f:
                    f.write(self._onnx_model)
            native = self._start_native(settings)
        _LIVE.add(self)
        return native

    @staticmethod
    def _start_native(settings: Dict[str, Any]) -> "_native.NativeCollector":
        try:
            return _native.NativeCollector(settings)
        except _native.ConfigError as e:
            field = getattr(e, "field", None)
            if field not in _FIELD_NAMES:
                raise
            ours = _FIELD_NAMES[field]
            err = _native.ConfigError(str(e).replace(f"`{field}`", f"`{ours}`"))
            err.field = ours
            raise err from None

    # ---- iteration
    def next(self) -> Any:
        """The next batch, or ``None`` once ``total_frames`` have been yielded: a
        :class:`Batch`, or a ``tensordict.TensorDict`` for a torch policy (or
        ``tensordict=True``).

        Waits with the GIL released; Ctrl-C raises ``KeyboardInterrupt`` and the
        batch being waited for is the one the next call returns. After
        :meth:`shutdown` it raises :class:`CollectorError` (the run is over); a
        ``shutdown`` from another thread while it waits ends the wait with ``None``."""
        raw = self._native.next_batch()
        if raw is None:
            return None
        batch = Batch(raw)
        if not self._tensordict:
            return batch if self._postproc is None else self._postproc(batch)
        from ._tensordict import to_tensordict

        if self._torch_policy is None:
            td = to_tensordict(batch, is_init=self._init_tracker, agent_masks=self._agent_masks)
        else:
            p = self._torch_policy
            one_hot = p.n_actions if p.action_encoding == "one_hot" else None
            td = to_tensordict(
                batch,
                one_hot=one_hot,
                log_prob_key=p.log_prob_key,
                leave_out=p.drop_keys,
                is_init=self._init_tracker,
                agent_masks=self._agent_masks,
            )
        if self._episode_reward is not None:
            self._episode_reward.write(td)
        if self._policy_version:
            # torchrl's `track_policy_version=True`: the root `policy_version`, here the
            # weights version each frame was collected with.
            td["policy_version"] = td["collector", "weights_version"]
        return td if self._postproc is None else self._postproc(td)

    def __iter__(self) -> Iterator[Any]:
        """The batches until ``total_frames`` (torchrl's iteration); iterating a
        collector that was shut down raises :class:`CollectorError`."""
        while True:
            batch = self.next()
            if batch is None:
                return
            yield batch

    def __len__(self) -> int:
        """Number of batches the run yields, as torchrl's collectors count them:
        ``ceil(total_frames / frames_per_batch)`` (the last batch may be shorter). An
        endless run (``total_frames=-1``) has no length: ``RuntimeError``, as torchrl."""
        total = self.total_frames
        if total > 0:
            return -(total // -self.frames_per_batch)
        raise RuntimeError("Non-terminating collectors do not have a length (total_frames=-1)")

    def __bool__(self) -> bool:
        # A collector is true whatever its length (an endless one has none).
        return True

    @property
    def frames_per_batch(self) -> int:
        """Frames of each batch (the last batch of ``total_frames`` may be shorter)."""
        return self._native.frames_per_batch

    @property
    def total_frames(self) -> int:
        """Frames the run yields in all; -1: endless."""
        return self._native.total_frames

    @property
    def policy(self) -> Any:
        """The policy as it was passed: the torch module (exported to the nodes as
        the ``onnx`` policy), a kind (``"linear"``), a config dict, or ``None`` (the
        default, ``linear``)."""
        if self._torch_policy is not None:
            return self._torch_policy.module
        return self._policy_given

    def reset(self, reset_idx: Optional[Sequence[bool]] = None) -> None:
        """torchrl's ``reset()``: every env of every node starts a new episode (new
        trajectory ids, ``step_count`` 0); the episodes in progress are cut without
        ``done``. The envs are reseeded from the run's next unused seeds (the seed
        chain of :meth:`set_seed` continued), so the run stays reproducible from
        ``seed``. A sync run's next batch starts every episode anew; in an async run
        each node first delivers the batch it is collecting (nodes collect ahead of
        the loop) and starts anew in the one after. ``reset_idx`` (torchrl's
        per-worker mask) may only select every node: nodes are reset together."""
        if reset_idx is not None:
            mask = list(reset_idx)
            if len(mask) != self.nodes or not all(bool(m) for m in mask):
                raise _config_error(
                    "reset_idx",
                    f"rollout resets every node's envs together: give None or {self.nodes} x True, got {mask!r}",
                )
        self._native.reset_envs()

    # ---- weights, seeds
    def update_policy_weights_(
        self,
        policy_or_weights: Any = None,
        worker_ids: Union[None, int, Iterable[int]] = None,
        *,
        weights: Optional[Mapping[str, Any]] = None,
    ) -> Optional[int]:
        """Stores ``policy_or_weights`` (names to arrays; ``weights`` is the same
        argument) as the next version and pushes them to ``worker_ids`` (all nodes
        when ``None``); returns the new version. With nothing given the stored
        weights are pushed again.

        With a torch policy: the module, its ``state_dict`` or
        ``TensorDict.from_module(module)``, by the module's parameter names; with
        nothing given, the current parameters of the module the collector was
        built with (torchrl's behaviour). Names, shapes, dtypes and contiguity are
        checked first: a ``ConfigError`` on ``weights`` names the tensor, and
        nothing is stored."""
        if weights is not None:
            if policy_or_weights is not None:
                raise _config_error("weights", "give policy_or_weights or weights, not both")
            policy_or_weights = weights
        ids = _worker_ids(worker_ids, self.nodes)
        if self._torch_policy is not None:
            arrays = self._torch_policy.weights(policy_or_weights)
            return self._native.update_policy_weights(arrays, ids)
        if policy_or_weights is None:
            self._native.push_policy_weights(ids)
            return None
        return self._native.update_policy_weights(_weights(policy_or_weights), ids)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Reseeds every node (node k gets the seed node k-1 did not use); returns the next seed."""
        if static_seed:
            raise _config_error("static_seed", "not supported: every node gets a seed of its own")
        return self._native.set_seed(seed)

    # ---- checkpoints
    def state_dict(self) -> Dict[str, Any]:
        """A checkpoint of the whole run (``{"checkpoint": bytes}``), taken between batches."""
        return {"checkpoint": self._native.checkpoint()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Goes on from ``state_dict``: this run stops and the same settings restart
        from the checkpoint (frames yielded, weights, every env and generator)."""
        checkpoint = _checkpoint(state_dict)
        _native.check_checkpoint(checkpoint)  # garbage is refused before the run stops
        self._native.shutdown()
        settings = dict(self._settings)
        settings["resume"] = checkpoint
        self._native = self._start(settings)

    # ---- the rest
    def stats(self) -> Dict[str, Any]:
        """``restarts`` (per node), ``dropped_late``, ``dropped_lagging`` and
        ``frames_dropped_lagging`` (batches past ``max_policy_lag``, asked again), ``frames_collected``,
        ``batches_recycled`` (batches Python freed, whose storage went back to the
        run), and for an elastic run ``joined`` (nodes that joined, the first ones
        included) and ``left`` (nodes that left with ``leave``); both 0 otherwise.
        After :meth:`shutdown` (or the ``with`` block), the last ones, read once
        every node was down."""
        return self._native.stats()

    @property
    def nodes(self) -> int:
        """Number of nodes (an elastic run: its slots, ``max_nodes``)."""
        return self._native.nodes

    def listen_addr(self) -> Optional[str]:
        """The address remote nodes join, when they do."""
        return self._native.listen_addr()

    def metrics_addr(self) -> Optional[str]:
        """The address the run's Prometheus metrics are served on, when they are."""
        return self._native.metrics_addr()

    def node_pids(self) -> list:
        """Process ids of the node processes (``process`` launcher)."""
        return self._native.node_pids()

    def slurm_job_ids(self) -> list:
        """Every SLURM job of the run (``slurm`` launcher)."""
        return self._native.slurm_job_ids()

    def shutdown(self) -> None:
        """Stops every node and joins every thread; idempotent. Iterating afterwards
        raises :class:`CollectorError`; :meth:`stats` keeps the last stats. A run still
        going when the interpreter exits is shut down then."""
        _LIVE.discard(self)
        ray_nodes = getattr(self, "_ray_nodes", None)
        if ray_nodes is not None:
            # Nodes that end at the shutdown are not replaced; the actors go after it.
            ray_nodes.stop_replacing()
        self._native.shutdown()
        if ray_nodes is not None:
            ray_nodes.stop()

    def __enter__(self) -> "DistributedCollector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        s = self._settings
        return f"DistributedCollector(env={s.get('env')!r}, nodes={s.get('nodes', 1)}, frames_per_batch={s.get('frames_per_batch')}, sync={s.get('sync')})"
