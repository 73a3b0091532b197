"""The workloads of bench_workloads.py: ``atari_envs`` (gymnasium only: registers the
preprocessed Pong id, imported by the nodes with ``--import workloads.atari_envs``) and
``actors`` (torch: the Nature-CNN and the 256-256 Gaussian torchrl actors)."""
