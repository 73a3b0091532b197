"""TLS from Python (docs/cluster.md, TLS): ``tls_cert``/``tls_key`` for the trainer and
``tls_ca`` for the nodes the process launcher starts give the frames of the same run
over plain TCP; a file that cannot be used is a ConfigError naming the argument and the
file. Certificates are made for the test with the ``openssl`` command, as docs/cluster.md
makes them (skipped without it); none is checked in."""

import pathlib
import shutil
import subprocess

import numpy as np
import pytest
import rollout

from conftest import rollout_bin


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make the test's certificates")
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=rollout test CA", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    _openssl("req", *ec, "-subj", "/CN=trainer", "-keyout", "trainer.key", "-out", "trainer.csr", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "x509", "-req", "-in", "trainer.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "san.ext", "-out", "trainer.pem", cwd=d,
    )
    return d


def _frames(**kw):
    """Every batch of a sync CartPole run of 2 process nodes as ``{key: array}``, in order."""
    with rollout.DistributedCollector(
        "CartPole-v1", nodes=2, frames_per_batch=60, total_frames=360, seed=18, sync=True,
        launcher="process", node_program=rollout_bin(), **kw,
    ) as c:
        return [{k: np.array(b[k]) for k in ("observation", "action", ("next", "reward"))} for b in c]


def test_a_run_over_tls_gives_the_frames_of_the_plain_run(certs):
    plain = _frames()
    secure = _frames(
        tls_cert=certs / "trainer.pem", tls_key=str(certs / "trainer.key"), tls_ca=certs / "ca.pem",
    )
    assert len(secure) == len(plain) == 6
    for a, b in zip(plain, secure):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=str(key))


def test_a_missing_certificate_is_a_config_error_naming_the_argument_and_the_file(certs):
    missing = certs / "missing.pem"
    with pytest.raises(rollout.ConfigError) as e:
        _frames(tls_cert=missing, tls_key=certs / "trainer.key", tls_ca=certs / "ca.pem")
    assert e.value.field == "tls_cert"
    assert str(missing) in str(e.value)


def test_process_nodes_need_the_ca_to_check_the_trainer_against(certs):
    with pytest.raises(rollout.ConfigError) as e:
        _frames(tls_cert=certs / "trainer.pem", tls_key=certs / "trainer.key")
    assert e.value.field == "tls_ca"
