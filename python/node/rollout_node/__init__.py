"""A rollout node in Python: joins a rollout trainer (PROTOCOL.md) and steps any
gymnasium env with the policy the trainer sends.

Modules: ``wire`` (frames, tensors, the proof), ``spaces`` (the env's gymnasium spaces as
``ready.specs`` and the batch entries they give), ``policy`` (the numpy forward pass and
action rules), ``collect`` (the env workers as one SyncVectorEnv, batches, supervision),
``session`` (the connection: handshake, reader and writer threads, heartbeats),
``__main__`` (the command line), ``replay`` and ``replay_by_seed`` (check a ``--output`` file
against gymnasium).
"""

__version__ = "0.1.0"
