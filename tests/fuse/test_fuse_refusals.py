"""A refusal on the mount that only tierd's rules explain (a bucket name S3 would refuse, a
file at the mount root) is logged in one line saying why, at info level and rate-limited:
the program sees only EINVAL or EPERM."""

from __future__ import annotations

import errno
import os
import re
import time
import uuid

import pytest
from conftest import Daemon


def _refused(fn: object, *args: object) -> int:
    with pytest.raises(OSError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.errno or 0


def _wait_for(daemon: Daemon, pattern: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        found = [x for x in daemon.log.splitlines() if re.search(pattern, x)]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, f"no log line matching {pattern!r}"
        time.sleep(0.05)


def test_invalid_bucket_name_and_root_files_are_explained_in_the_log(daemon: Daemon) -> None:
    tag = uuid.uuid4().hex[:8]
    name = f"ImageNet{tag}"
    assert _refused(os.mkdir, daemon.mnt / name) == errno.EINVAL
    line = _wait_for(daemon, f"{name}.*invalid bucket name|invalid bucket name.*{name}")
    assert "level=info" in line and "mkdir" in line, line
    assert "lowercase" in line, line
    root_file = daemon.mnt / f"file-{tag}"
    assert _refused(root_file.write_bytes, b"x") == errno.EPERM
    line = _wait_for(daemon, f"file-{tag}.*root|root.*file-{tag}")
    assert "level=info" in line and "only buckets" in line, line


def test_refusal_lines_are_rate_limited(daemon: Daemon) -> None:
    tag = uuid.uuid4().hex[:8]
    before = daemon.log.count(f"Bad{tag}")
    for i in range(300):
        assert _refused(os.mkdir, daemon.mnt / f"Bad{tag}{i}") == errno.EINVAL
    time.sleep(0.5)
    logged = daemon.log.count(f"Bad{tag}") - before
    assert 1 <= logged <= 20, logged
    # after the quiet period the next refusal is logged again, with what was left out
    time.sleep(10.5)
    assert _refused(os.mkdir, daemon.mnt / f"Late{tag}") == errno.EINVAL
    line = _wait_for(daemon, f"Late{tag}")
    assert re.search(r"suppressed=\d+", line), line
