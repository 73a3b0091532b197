"""torchrl's collector arguments that rollout's ``DistributedCollector`` takes beside its own,
so that a torchrl script's collector line runs unchanged: each is honoured, accepted where its
value changes nothing here (torchrl's default, or a knob of torchrl's own loop), or refused in
one sentence that says what to do instead. A name torchrl's collectors do not take stays
Python's ``TypeError``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

#: Any value: a knob of torchrl's own in-process loop (buffers, CUDA syncs, trusting the
#: policy's output), which rollout's nodes do not have.
ANY = object()

#: name -> (the values accepted, why another is refused). The accepted values are torchrl's
#: default and those meaning what rollout does anyway.
_ARGS: Dict[str, Tuple[Any, str]] = {
    "policy_factory": ((None,), "rollout's nodes run the `policy` given, exported once; pass the policy itself"),
    "create_env_kwargs": (
        (None, {}),
        "give the env its kwargs where it is made: a callable or EnvCreator that takes none, or env_config for an env id",
    ),
    "track_traj_ids": ((True,), "rollout always records ('collector', 'traj_ids')"),
    "return_same_td": ((False,), "each batch is a TensorDict of its own"),
    "reset_when_done": ((True,), "rollout's nodes reset every env whose episode ends"),
    "interruptor": ((None,), "rollout's sync batches are whole: every node delivers its share"),
    "set_truncated": (
        (False,),
        "rollout marks truncated where the env or max_frames_per_traj cuts an episode, never at a batch's end",
    ),
    "use_buffers": (ANY, ""),
    "trust_policy": (ANY, ""),
    "no_cuda_sync": (ANY, ""),
    "replay_buffer": ((None,), "extend your replay buffer with each batch (buffer.extend(batch.reshape(-1)))"),
    "extend_buffer": ((True, False), ""),
    "local_init_rb": ((None, False, True), ""),
    "compile_policy": ((None, False), "the nodes run the policy's ONNX export, not torch.compile"),
    "cudagraph_policy": ((None, False), "the nodes run the policy on the CPU, without CUDA graphs"),
    "weight_updater": ((None,), "rollout sends the policy's weights to the nodes with update_policy_weights_()"),
    "weight_sync_schemes": ((None,), "rollout sends the policy's weights to the nodes with update_policy_weights_()"),
    "weight_recv_schemes": ((None,), "rollout sends the policy's weights to the nodes with update_policy_weights_()"),
    "worker_idx": ((None,), "rollout numbers its nodes itself"),
    "backend": ((None,), "rollout is the backend: choose where nodes run with launcher= and nodes="),
    "backend_options": ((None,), "rollout is the backend: choose where nodes run with launcher= and nodes="),
    "num_collectors": ((None,), "rollout's nodes are its collectors: pass nodes="),
    "track_policy_version": ((False, True), "pass True: rollout writes `policy_version` from the weights version of each frame"),
    "auto_register_policy_transforms": (ANY, ""),
    "compact_obs": ((False,), "rollout's batches carry ('next', 'observation') as torchrl's default layout does"),
    "pre_collect_hook": ((None,), "call it yourself before iterating, or pass postproc= for each batch"),
    "post_collect_hook": ((None,), "pass postproc=, which rollout calls on each batch"),
    "traj_format": ((None,), "rollout yields frames_per_batch frames; split_trajs=True lays them out as trajectories"),
    "trajs_per_batch": ((None,), "rollout yields frames_per_batch frames; split_trajs=True lays them out as trajectories"),
    "trajs_per_write": ((None,), "rollout yields frames_per_batch frames; split_trajs=True lays them out as trajectories"),
}


def names() -> Tuple[str, ...]:
    """The torchrl arguments taken, in a stable order (for the docs)."""
    return tuple(sorted(_ARGS))


def check(owner: str, given: Mapping[str, Any]) -> bool:
    """Checks the torchrl arguments ``given`` (keyword arguments no parameter of ``owner``
    took) and returns whether ``track_policy_version`` asks for ``policy_version`` in
    TensorDict batches. An unknown name is Python's ``TypeError``; a value rollout cannot
    honour is a ConfigError naming it, in one sentence."""
    from ._collector import _config_error

    for name, value in given.items():
        if name not in _ARGS:
            raise TypeError(f"{owner}() got an unexpected keyword argument '{name}'")
        accepted, why = _ARGS[name]
        if accepted is ANY or _among(value, accepted):
            continue
        shown = repr(value) if isinstance(value, (bool, int, float, str, type(None))) else type(value).__name__
        raise _config_error(name, f"{shown:.60}: {why}")
    return bool(given.get("track_policy_version", False))


def _among(value: Any, accepted: Tuple[Any, ...]) -> bool:
    """``value`` is one of ``accepted`` (booleans and None by identity, so 1 is not True)."""
    for a in accepted:
        if isinstance(a, (bool, type(None))):
            if value is a:
                return True
        elif type(value) is type(a) and value == a:
            return True
    return False
