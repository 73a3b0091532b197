"""The build backend of ``pip install ./python/collector``: maturin's, told never to
download a Rust toolchain.

maturin's backend fetches one (about 0.9 GB, silently, through ``puccinialin``) when no
``cargo`` is on ``PATH``. This one sets ``MATURIN_NO_INSTALL_RUST`` before maturin reads
it and, without ``cargo``, fails at once saying what to install.
"""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("MATURIN_NO_INSTALL_RUST", "1")

import maturin  # noqa: E402 - after the variable it reads

NO_CARGO = (
    "rollout's extension is Rust: building it needs cargo on PATH (rustup.rs, or your distribution's "
    "`cargo` package); it will not download a toolchain. Or install a wheel built elsewhere "
    "(maturin build --release -m python/collector/Cargo.toml)."
)


def _need_cargo() -> None:
    if shutil.which("cargo") is None:
        raise RuntimeError(NO_CARGO)


def get_requires_for_build_wheel(config_settings=None):
    return maturin.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return maturin.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _need_cargo()
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _need_cargo()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _need_cargo()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return maturin.build_sdist(sdist_directory, config_settings)
