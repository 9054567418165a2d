"""The lease probe that keeps FUSE write passthrough off where the hot tier's file system
grants no write leases (fuse/kpass.py ``_leases_work``): without leases the last release
could not tell a shared mapping that outlived its descriptor, so such a mount must keep
the WRITE path."""

from __future__ import annotations

import os
from pathlib import Path

from tierd_fuse.kpass import _leases_work


def test_the_probe_takes_and_gives_back_a_lease(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x")
    fd = os.open(p, os.O_RDWR)
    try:
        assert _leases_work(fd)
        other = os.open(p, os.O_RDWR)  # the lease was given back: this open does not block
        try:
            assert _leases_work(fd)  # refused for the other descriptor: leases still work
        finally:
            os.close(other)
    finally:
        os.close(fd)


def test_the_probe_says_no_where_the_kernel_refuses_leases(tmp_path: Path) -> None:
    """A descriptor of a FIFO: F_SETLEASE answers EINVAL, as on a file system without
    leases."""
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        assert not _leases_work(fd)
    finally:
        os.close(fd)
