"""The workloads of bench_workloads.py: ``atari_envs`` (gymnasium only: registers the
preprocessed Pong id, imported by the nodes with ``--import workloads.atari_envs``),
``actors`` (torch: the Nature-CNN and the 256-256 Gaussian torchrl actors) and
``sf_peer`` (Sample Factory's sampler, run in a venv of its own: ``scripts/sf-venv.sh``)."""
