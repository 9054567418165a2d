"""A short run of ``bench/fuse_null.py --c``: the empty-handler request loop and the C floor
beside it (``bench/fuse_null_c.c``, built with gcc against libfuse3, also making a local
file per create) both mount, take the client's creates and writes, and report them -- so
the floor docs/fuse.md quotes does not break unseen.  Rates are not asserted (a machine
shared with other work decides them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fuse_null.py"


@pytest.mark.skipif(os.geteuid() != 0, reason="fuse_null mounts with mount(2): root only")
@pytest.mark.timeout(120)
def test_the_null_loop_and_its_c_floor_run_and_report(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH), "--files", "200", "--write-mib", "8", "--c",
         "--c-backing", str(tmp_path), "--poll-us", "100", "--rounds", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=110)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    assert len(doc["rounds"]) == 2
    for one in doc["rounds"]:
        assert one["create"]["per_s"] > 0 and one["create_c"]["per_s"] > 0
        assert one["create_c_backing"]["per_s"] > 0 and one["create_c_ahead"]["per_s"] > 0
        assert one["write"]["MBps"] > 0 and one["write"]["mean_request_bytes"] > 0
    assert set(doc["idle"]) == {"cpuidle_governor", "guest_halt_poll_ns"}
    assert doc["poll_us"] == 100
    assert not list(tmp_path.glob("tierd-null-c-backing-*"))  # the local files went too
    assert not [line for line in Path("/proc/mounts").read_text().splitlines()
                if "fuse_null_c" in line or "tierd-null-" in line], "a mount was left"
