"""Registers ``RolloutBench/Pong84-v5`` with gymnasium on import, and ale-py's own
``ALE/...`` ids: ALE/Pong-v5 under the usual DQN preprocessing, gymnasium's
``AtariPreprocessing`` (no-op starts up to 30, a frame skip of 4 with the max over the
last two frames, 84x84 grayscale, uint8) and ``FrameStackObservation`` of 4: an
observation of uint8 ``[4, 84, 84]``, 6 actions. The emulator is made with
``frameskip=1`` (``AtariPreprocessing`` skips frames itself) and keeps v5's sticky
actions (``repeat_action_probability=0.25``). One step of it is 4 emulator frames, as one
step of ALE/Pong-v5 is; the benches count steps.

Only gymnasium, ale-py and OpenCV (``AtariPreprocessing`` resizes with ``cv2``;
``pip install opencv-python-headless``) are imported, so a Python node can import it
(``python -m rollout_node --import workloads.atari_envs``, with this directory's parent,
python/collector/bench, on ``PYTHONPATH``).
"""

import ale_py
import gymnasium as gym

PONG84 = "RolloutBench/Pong84-v5"

gym.register_envs(ale_py)


def make_pong84(frameskip=1, **kwargs):
    """ALE/Pong-v5 preprocessed: ``[4, 84, 84]`` uint8 (keyword arguments go to ``gym.make``).

    ``frameskip`` is the emulator's and must stay 1 (``AtariPreprocessing`` skips 4):
    torchrl's ``GymEnv`` passes its ``frame_skip`` (default 1) as ``frameskip``."""
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    if frameskip != 1:
        raise ValueError(f"{PONG84} skips 4 frames itself (AtariPreprocessing): frameskip must be 1, got {frameskip}")
    env = gym.make("ALE/Pong-v5", frameskip=1, **kwargs)
    env = AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True, scale_obs=False)
    return FrameStackObservation(env, stack_size=4)


if PONG84 not in gym.registry:
    gym.register(PONG84, entry_point=make_pong84)
