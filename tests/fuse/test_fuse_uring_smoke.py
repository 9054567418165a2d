"""A short run of ``bench/fuse_uring.py``: each transport's daemon (``bench/fuse_null_uring.c``
and its Python twin over ``tierd_fuse.kuring``) mounts, takes the client's creates and
reports them -- and, where this kernel has FUSE over io_uring, the rings (not ``/dev/fuse``)
answered them, so the floor docs/fuse.md quotes for each transport is what it says.  Rates
are not asserted (a machine shared with other work decides them)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from tierd_fuse import kuring

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fuse_uring.py"
ENABLE = kuring.ENABLE
FILES = 200


def _enable() -> str | None:
    try:
        return ENABLE.read_text().strip()
    except OSError:
        return None


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemons mount with mount(2): root only")
@pytest.mark.timeout(180)
def test_each_transport_answers_the_creates_through_its_own_path(tmp_path: Path) -> None:
    before = _enable()
    run = subprocess.run([sys.executable, str(BENCH), "--files", str(FILES), "--rounds", "1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=170)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _enable() == before, "enable_uring was not set back"
    doc = json.loads(run.stdout)
    (one,) = doc["rounds"]
    # a create is five requests (LOOKUP, CREATE, FLUSH, RELEASE, the parent's GETATTR)
    for mode in ("dev", "python_dev"):
        assert one[mode]["per_s"] > 0
        assert one[mode]["served"]["dev"] >= 5 * FILES
        assert set(one[mode]["ipis_per_create"]) <= {"RES", "CAL"}
    if doc["uring"] == "on":
        for mode in ("uring", "uring_unpinned", "uring_one_thread", "python_uring",
                     "python_uring_one_thread"):
            served = one[mode]["served"]
            assert len(served["queues"]) == len(one["dev"]["served"]["queues"]) >= 1
            # (requests that come before every queue has its entries go to /dev/fuse)
            assert sum(served["queues"]) >= 5 * FILES - 10, (mode, served)
    else:
        assert set(one) == {"dev", "python_dev"}, doc["uring"]
    assert not [line for line in Path("/proc/mounts").read_text().splitlines()
                if "tierd-uring-" in line], "a mount was left"


def test_the_queue_count_is_the_possible_cpus() -> None:
    assert kuring.possible_cpus("0-1\n") == 2
    assert kuring.possible_cpus("0") == 1
    assert kuring.possible_cpus("0-3,8-11") == 8
    assert kuring.possible_cpus() >= (os.cpu_count() or 1)  # (possible: online and not)


def test_an_entry_holds_its_answer_where_the_kernel_reads_it() -> None:
    """struct fuse_uring_req_header: in_out[128], op_in[128], then fuse_uring_ent_in_out
    {u64 flags; u64 commit_id; u32 payload_sz; ...}: the payload size at byte 272."""
    e = kuring.Entry(7, 1 << 16)
    try:
        assert e.iov[0].len == 288 and e.iov[1].len == 1 << 16
        struct.pack_into("<QQI", e.header, 256, 0, 12345, 5)  # as the kernel fills it
        e.payload[:5] = b"hello"
        head, op, payload, commit_id = e.request()
        assert (len(head), len(op), bytes(payload), commit_id) == (128, 128, b"hello", 12345)
        del head, op, payload
        e.answer(b"H" * 16, b"abc")
        assert e.header[:16] == b"H" * 16 and e.payload[:3] == b"abc"
        assert struct.unpack_from("<I", e.header, 272) == (3,)
    finally:
        e.close()
    ring = kuring.Ring(-1, 4)  # (no FUSE command is sent: the ring alone)
    ring.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemons mount with mount(2): root only")
@pytest.mark.timeout(120)
def test_passthrough_creates_register_a_backing_file_each(tmp_path: Path) -> None:
    """``--passthrough``: every create is answered as a passthrough open of a file made
    ahead, through ``/dev/fuse`` and (where the kernel has them) over the rings."""
    before = _enable()
    run = subprocess.run([sys.executable, str(BENCH), "--files", str(FILES), "--rounds", "1",
                          "--passthrough", "--only", "dev_passthrough", "uring_passthrough"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=110,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert _enable() == before, "enable_uring was not set back"
    doc = json.loads(run.stdout)
    (one,) = doc["rounds"]
    assert set(one) == ({"dev_passthrough", "uring_passthrough"} if doc["uring"] == "on"
                        else {"dev_passthrough"})
    for mode, res in one.items():
        # the client's creates and its warm-up, each with a backing id of its own
        assert res["served"]["passthrough"] >= FILES, (mode, res["served"])
    if "uring_passthrough" in one:
        assert sum(one["uring_passthrough"]["served"]["queues"]) >= 5 * FILES - 10
    assert not [line for line in Path("/proc/mounts").read_text().splitlines()
                if "tierd-uring-" in line], "a mount was left"
