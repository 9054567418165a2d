"""A short crash-torture run per cold engine: zero violations.

``bench/torture.py`` (a real daemon with a FUSE mount, concurrent S3 and FUSE writers,
SIGKILL, restart, verification through both doors and of the cold store read directly) for
three short cycles, as a subprocess.  The long run (200 cycles and more) is the same command
with ``--cycles``; ``tests/durability/test_torture_checker.py`` shows the checker reports the
violations it looks for, so a clean run here means something.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "torture.py"
CYCLES = 3
#: the writers' operations, per door: a run acknowledges some of each door, and (once it
#: acknowledged enough to have tried them all) every kind -- a writer whose operations all
#: fail would otherwise pass unseen.  (A machine loaded by other work runs few operations.)
S3_KINDS = ("put-small", "put-large", "multipart", "delete", "copy")
FUSE_KINDS = ("create", "write", "append", "trunc-write", "rename-over", "unlink")
ENOUGH = 300


def summary(doc: dict) -> str:  # type: ignore[type-arg]
    lines = [f"{doc['violations_total']} violations {doc['violations_by_kind']} "
             f"(work dir {doc['work_dir']})"]
    for v in doc["violations"][:12]:
        lines.append(f"  cycle {v['cycle']} {v['kind']} {v['door']} {v['key']}: {v['detail']}"
                     f" expected={json.dumps(v['expected'])[:300]} "
                     f"seen={json.dumps(v['seen'])[:200]}")
    return "\n".join(lines)


@pytest.mark.timeout(150)
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no FUSE in this machine")
@pytest.mark.parametrize("cold", ["file", "s3"])
def test_short_torture_run_has_no_violations(cold: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    r = subprocess.run(
        [sys.executable, str(BENCH), "--cycles", str(CYCLES), "--cold", cold, "--seed", "7",
         "--min-run", "0.6", "--max-run", "1.2", "--fuse-op-kills", "0.4", "--evict-every", "2",
         "--import-ttl", "0",
         "--s3-writers", "2", "--fuse-writers", "2", "--keys", "6", "--large", "2",
         "--work-dir", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, timeout=140, stdin=subprocess.DEVNULL)
    assert out.exists(), f"torture.py exited {r.returncode}:\n{r.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["violations"] == [], summary(doc)
    assert doc["cycles"] == CYCLES and sum(doc["kills"].values()) == CYCLES, doc["kills"]
    acked = doc["ops_acknowledged"]
    for kinds in (S3_KINDS, FUSE_KINDS):
        assert any(acked.get(k) for k in kinds), f"no {kinds} acknowledged: {acked}"
    if doc["ops_acknowledged_total"] >= ENOUGH:
        missing = [k for k in S3_KINDS + FUSE_KINDS if not acked.get(k)]
        assert not missing, f"no {missing} acknowledged: {acked}"
    assert r.returncode == 0, r.stderr[-3000:]
