"""A token file is bounded input: only a regular file of at most 64 KiB is read; a FIFO, a
directory or a device is refused from its metadata, without being read or waited on."""

import os
import time

import pytest

from rollout_node.wire import MAX_TOKEN_FILE, TokenError, read_token


def refused(path, **kw):
    started = time.monotonic()
    with pytest.raises(TokenError) as e:
        read_token(str(path), **kw)
    assert time.monotonic() - started < 5, "refused without waiting"
    return str(e.value)


def test_a_regular_token_file_is_read_without_its_trailing_newline(tmp_path):
    p = tmp_path / "token"
    p.write_bytes(b"a-token-of-16-bytes-or-more\n")
    p.chmod(0o600)
    assert read_token(str(p)) == b"a-token-of-16-bytes-or-more"


def test_a_fifo_a_directory_and_dev_zero_are_refused_unread(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    assert refused(fifo) == f"the token file {fifo} is a FIFO, not a regular file"
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    assert refused(d) == f"the token file {d} is a directory, not a regular file"
    assert refused("/dev/zero", insecure_file_ok=True) == "the token file /dev/zero is a character device, not a regular file"


def test_a_token_file_over_the_limit_is_refused_unread(tmp_path):
    p = tmp_path / "huge"
    with open(p, "wb") as f:
        f.truncate(2 << 30)  # sparse: nothing is written, nothing may be read
    p.chmod(0o600)
    assert refused(p) == f"the token file {p} holds {2 << 30} bytes, over the limit of {MAX_TOKEN_FILE}"
