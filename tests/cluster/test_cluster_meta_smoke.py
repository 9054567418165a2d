"""A short run of ``bench/cluster_meta.py`` (its own PostgreSQL, moto and three-node cluster,
as a subprocess): every phase of the PostgreSQL runs makes progress, and what ``--lock`` and
``--statements`` report is there and consistent -- so the long runs the docs quote do not
break unseen.  Rates are not asserted (a machine shared with other work decides them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import _missing

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cluster_meta.py"


@pytest.mark.timeout(240)
def test_the_cluster_metadata_bench_runs_and_reports(tmp_path: Path) -> None:
    why = _missing()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    out = tmp_path / "cm.json"
    run = subprocess.run(
        [sys.executable, str(BENCH), "--clients", "3", "--files", "10", "--skip-lmdb",
         "--lock", "--statements", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=220)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    for nodes in ("pg_3_nodes", "pg_1_node"):
        for phase in ("create", "stat", "rename", "unlink"):
            assert doc[nodes][phase] > 0, (nodes, phase)
            lock = doc[nodes][f"{phase}_lock"]
            assert lock["samples"] > 0
            assert 0 <= lock["writer_held"] <= 1 and 0 <= lock["cpu_idle"] <= 1
            parts = lock["holder_client"] + lock["holder_io"] + lock["holder_running"]
            assert parts == 0 or 0.9 <= parts <= 3.0, lock  # (each a share of the holds)
            stmts = doc[nodes][f"{phase}_statements"]
            assert stmts["top"] and all(len(t) == 3 for t in stmts["top"])
        # a write phase holds the writer lock in some samples and runs statements for it
        assert doc[nodes]["create_statements"]["all"] > 0
