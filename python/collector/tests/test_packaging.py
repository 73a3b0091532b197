"""The package as Python users expect it: one version, types shipped, every
documented argument in the signature."""

import ast
import importlib.metadata
import inspect
import os
import pathlib
import re
import tomllib

import pytest

import rollout
from rollout import _native

HERE = os.path.dirname(__file__)
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
PACKAGE = os.path.dirname(rollout.__file__)


def cargo_version():
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)["workspace"]["package"]["version"]


def test_one_version_for_the_crates_and_both_packages():
    version = cargo_version()
    assert rollout.__version__ == version
    assert importlib.metadata.version("rollout") == version
    node = pytest.importorskip("rollout_node")
    assert node.__version__ == version
    assert importlib.metadata.version("rollout-node") == version


def test_the_native_module_is_built_for_the_stable_abi():
    # One wheel for every CPython >= 3.9 (pyproject.toml: pyo3's abi3-py39).
    assert os.path.basename(_native.__file__).startswith("_native.abi3."), _native.__file__


def test_types_ship_with_the_package():
    assert os.path.isfile(os.path.join(PACKAGE, "py.typed"))
    assert os.path.isfile(os.path.join(PACKAGE, "_native.pyi"))


def stub_names():
    with open(os.path.join(PACKAGE, "_native.pyi")) as f:
        tree = ast.parse(f.read())
    top, methods = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
        if isinstance(node, ast.ClassDef) and node.name == "NativeCollector":
            methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"}
    return top, methods


def test_the_stub_describes_the_native_module_exactly():
    top, methods = stub_names()
    runtime = {n for n in dir(_native) if not n.startswith("_") or n == "__version__"}
    assert top == runtime
    native_methods = {n for n in dir(_native.NativeCollector) if not n.startswith("_")}
    assert methods == native_methods


def params():
    sig = inspect.signature(rollout.DistributedCollector.__init__)
    return [p for p in sig.parameters.values() if p.name != "self"]


def test_every_argument_is_in_the_signature_and_documented():
    from rollout import _torchrl_args

    ps = params()
    # One `**`: torchrl's other collector arguments, each named in the docs.
    assert [p.name for p in ps if p.kind is inspect.Parameter.VAR_KEYWORD] == ["torchrl_kwargs"]
    documented = set(re.findall(r"``([a-z_]+)``", rollout.DistributedCollector.__doc__))
    assert [p.name for p in ps if p.name not in documented] == []
    assert [n for n in _torchrl_args.names() if n not in documented] == []


def test_an_unknown_argument_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="frames_per_batchh"):
        rollout.DistributedCollector("CartPole-v1", frames_per_batchh=10)


# Arguments the Python side passes through to the Rust builder as they are: a value
# of the wrong type must come back as a ConfigError naming the argument, which shows
# the builder reads it under that name.
PASSED_THROUGH = [
    "policy_init_seed",
    "min_nodes",
    "max_nodes",
    "nan_is_failure",
    "max_restarts",
    "restart_window",
    "node_max_restarts",
    "node_restart_window",
    "continue_timeout",
    "continue_without_lost_nodes",
    "worker_nice",
    "batch_timeout",
    "request_timeout",
    "seed_timeout",
    "update_weights_timeout",
    "snapshot_timeout",
    "shutdown_timeout",
    "shutdown_ack_timeout",
    "join_timeout",
    "heartbeat",
    "heartbeat_timeout",
    "handshake_timeout",
    "listen",
    "advertise",
    "max_frame",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "tls_ca",
    "tls_server_name",
    "node_tls_cert",
    "node_tls_key",
    "metrics",
    "metrics_linger",
]


@pytest.mark.parametrize("name", PASSED_THROUGH)
def test_each_argument_reaches_the_builder_under_its_name(name):
    assert name in {p.name for p in params()}
    with pytest.raises(rollout.ConfigError) as e:
        rollout.DistributedCollector("CartPole-v1", frames_per_batch=10, **{name: [object()]})
    assert e.value.field == name, str(e.value)


def test_every_plain_setting_of_the_cli_is_an_argument():
    # The plain settings are one Rust struct (CollectorArgs) the CLI parses as flags and
    # this module reads from its keyword arguments: each of its fields must be one here.
    args_rs = pathlib.Path(__file__).resolve().parents[3] / "actors" / "src" / "collector" / "args.rs"
    body = args_rs.read_text().split("pub struct CollectorArgs {", 1)[1].split("\n}\n", 1)[0]
    fields = re.findall(r"^    pub ([a-z_]+): ", body, flags=re.M)
    assert len(fields) > 40, fields
    names = {p.name for p in params()}
    assert [f for f in fields if f not in names] == []


def test_the_build_backend_never_downloads_a_toolchain(monkeypatch, tmp_path):
    # pip runs _build/rollout_build.py (pyproject's backend-path): with no cargo on PATH
    # it asks for no toolchain installer and fails saying what to install.
    import importlib
    import shutil
    import sys

    pytest.importorskip("maturin")
    build = pathlib.Path(__file__).resolve().parents[1] / "_build"
    monkeypatch.syspath_prepend(str(build))
    monkeypatch.chdir(build.parent)  # pip runs the backend in the project's folder
    monkeypatch.delenv("MATURIN_NO_INSTALL_RUST", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    sys.modules.pop("rollout_build", None)
    backend = importlib.import_module("rollout_build")
    assert os.environ.get("MATURIN_NO_INSTALL_RUST") == "1"
    assert "puccinialin" not in backend.get_requires_for_build_wheel()
    with pytest.raises(RuntimeError) as e:
        backend.build_wheel(str(tmp_path))
    assert "cargo" in str(e.value) and "download" in str(e.value)
    assert list(tmp_path.iterdir()) == []
    with open(pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
        system = tomllib.load(f)["build-system"]
    assert (system["build-backend"], system["backend-path"]) == ("rollout_build", ["_build"])
