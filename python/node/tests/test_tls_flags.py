"""The node's TLS flags (docs/python-node.md): a CA file that cannot be used, or a client
certificate without a CA, exits 2 with one line naming the flag, before the node dials.
A run over TLS against the real Rust trainer is tests/tests/tls.rs
(`python_nodes_over_tls_and_mutual_tls_yield_the_frames_of_their_plain_run`)."""

import pytest

from rollout_node.session import tls_context


def test_a_missing_ca_file_exits_2_naming_the_flag_and_the_file(trainer, tmp_path):
    missing = tmp_path / "missing-ca.pem"
    p = trainer.start_node("--tls-ca", str(missing))
    code, err = trainer.finish()
    assert code == 2, err
    assert err.startswith("error: invalid `tls_ca`:"), err
    assert str(missing) in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_client_certificate_without_a_ca_exits_2(trainer, tmp_path):
    trainer.start_node("--tls-cert", str(tmp_path / "node.pem"), "--tls-key", str(tmp_path / "node.key"))
    code, err = trainer.finish()
    assert code == 2, err
    assert "invalid `tls_ca`" in err, err


def test_a_file_that_is_not_pem_names_the_flag(tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="^tls_ca: cannot use"):
        tls_context(str(bad))


def test_a_client_certificate_needs_its_key():
    with pytest.raises(ValueError, match="^tls_cert: --tls-cert and --tls-key go together"):
        tls_context("unused-ca.pem", cert="x.pem")
