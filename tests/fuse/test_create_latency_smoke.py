"""A short run of ``bench/create_latency.py``: a daemon per round mounts, takes the client's
creates, reports them with the raw baseline, the wake-ups between CPUs they caused and the
file system under them (``hot_fs``),
and every round's directory is removed after the last -- so the benchmark docs/fuse.md
quotes does not break unseen.  Rates are not asserted (a machine shared with other work
decides them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "create_latency.py"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: the daemon's pool socket lives in its data directory,
    and pytest's own temporary paths can be too long for a unix socket."""
    d = Path(tempfile.mkdtemp(prefix="tcl-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon mounts with mount(2): root only")
@pytest.mark.timeout(180)
def test_create_latency_runs_reports_and_cleans_up(short_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env["TMPDIR"] = str(short_dir)  # the rounds' directories, and what hot_fs describes
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run(
        [sys.executable, str(BENCH), "--files", "60", "--warmup", "5", "--pairs", "2"],
        cwd=short_dir, capture_output=True, text=True, timeout=170, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    rounds = doc["runs"]["this"]
    assert len(rounds) == 2
    for one in rounds:
        assert one["creates_per_s"] > 0 and one["raw_creates_per_s"] > 0
        assert set(one["cpu_us_per_create"]) == {"loop", "threads", "helpers"}
        ipis = one["ipis_per_create"]  # the machine's wake-ups between CPUs per file
        rows = {line.split()[0] for line in Path("/proc/interrupts").read_text().splitlines()
                if line.split()}
        assert set(ipis) == {k for k in ("RES", "CAL") if k + ":" in rows}
        assert all(v >= 0 for v in ipis.values())
        if ipis and len(os.sched_getaffinity(0)) > 1:  # 60 conversations with the daemon
            assert sum(ipis.values()) > 0
    fs = doc["hot_fs"]
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    assert fs["mount"] in mounts and fs["fstype"]
    if fs["fstype"] == "ext4":  # whether it has a journal, as the kernel says
        task = Path(f"/sys/fs/ext4/{Path(fs['source']).name}/journal_task")
        said = task.read_text().strip() != "<none>" if task.exists() else None
        assert fs["journal"] == said
    assert not list(short_dir.glob("tierd-bench-create-*")), "a round's directory was left"
    assert not [m for m in mounts if str(short_dir) in m], "a mount was left"
