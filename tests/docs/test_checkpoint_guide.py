"""docs/checkpoint-guide.md's examples run against a real daemon, as a reader would run them.

The guide's code blocks marked ```` ```python test ```` or ```` ```sh test ```` run in order,
each in a fresh process, against one ``tierd serve --mount`` (with ``TIERD_DATA_DIR`` and
``TIERD_MOUNT`` set, ``tierctl`` on the PATH).  Then the node is "lost": the daemon is
stopped and its data directory deleted, a new daemon starts on an empty data directory and
the same cold store, and the blocks marked ```` ```python test-restore ```` run against it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from public_dir import public_tempdir
from s3.conftest import Daemon, start_daemon
from tierd_fuse.mount import find_mount, unmount

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "checkpoint-guide.md"
BLOCK = re.compile(r"^```(python|sh) (test|test-restore)\n(.*?)^```$", re.M | re.S)


def blocks(kind: str) -> list[tuple[str, str]]:
    return [(lang, code) for lang, k, code in BLOCK.findall(GUIDE.read_text()) if k == kind]


def run_block(lang: str, code: str, data: Path, mount: Path | None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env["TIERD_DATA_DIR"] = str(data)
    if mount is not None:
        env["TIERD_MOUNT"] = str(mount)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euc", code]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd="/")
    assert done.returncode == 0, (
        f"guide block failed ({lang}):\n{code}\n--- stdout\n{done.stdout}\n"
        f"--- stderr\n{done.stderr[-4000:]}")
    return done.stdout


def start(data: Path, cold: Path, *extra: str) -> Daemon:
    return start_daemon(data, "--cold-dir", str(cold), "--pool-capacity", "256MiB", *extra)


def stop(d: Daemon, mount: Path | None = None) -> list[str]:
    """Stop the daemon; the tracebacks in its log (known ones are left to the caller)."""
    d.stop()
    if mount is not None and find_mount(mount) is not None:
        with contextlib.suppress(Exception):
            unmount(mount, lazy=True)
    lines = d.log.read_text(errors="replace").splitlines()
    return [line for line in lines if "Traceback" in line]


@pytest.fixture
def where() -> Iterator[Path]:
    with public_tempdir("tierd-guide-") as path:
        yield path


def test_guide_has_the_examples_it_promises() -> None:
    main = blocks("test")
    assert len(main) >= 5 and any(lang == "sh" for lang, _ in main)
    assert [lang for lang, _ in blocks("test-restore")] == ["sh", "python"]
    text = "".join(code for _, code in main)
    for needle in ("ck.save(", "wait_persisted(", "ck.load(", "dcp.async_save(",
                   "TierdStorageReader(", "torch.save(", "PoolQuotaExceeded"):
        assert needle in text, needle


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="/dev/fuse is missing")
def test_guide_examples_run_against_a_daemon_and_restore_after_node_loss(where: Path) -> None:
    cold = where / "cold"
    data, mount = where / "node-a", where / "mnt"
    mount.mkdir()
    d = start(data, cold, "--mount", str(mount))
    try:
        deadline = time.monotonic() + 30
        while find_mount(mount) is None:
            assert time.monotonic() < deadline, "the mount did not appear"
            time.sleep(0.05)
        outputs = [run_block(lang, code, data, mount) for lang, code in blocks("test")]
    finally:
        errors = stop(d, mount)
    assert errors == []
    assert "kept: [1, 2, 3, 4, 5, 6]" in "".join(outputs)
    assert "bytes in pool memory:" in "".join(outputs)

    shutil.rmtree(data)  # the node and its local disks are gone; cold remains
    data_b = where / "node-b"
    d = start(data_b, cold)
    try:
        out = "".join(run_block(lang, code, data_b, None)
                      for lang, code in blocks("test-restore"))
    finally:
        assert stop(d) == []
    assert "steps found in cold: [1, 2, 3, 4, 5, 6]" in out
    assert "loaded from cold" in out


RACE = """
import torch
from tierd_client.checkpoint import Checkpointer

with Checkpointer(keep_cold=3) as ck:
    for step in range(1, 13):
        ck.save("race", step, {"w": torch.full((1 << 18,), float(step))})
    ck.wait_persisted("race", timeout=120)
    steps = [(s["step"], s["state"]) for s in ck.list("race")]
    print(steps)
    assert steps == [(10, "persisted"), (11, "persisted"), (12, "persisted")], steps
"""


def test_keep_cold_with_saves_faster_than_persistence(where: Path) -> None:
    data = where / "data"
    d = start(data, where / "cold")
    try:
        run_block("python", RACE, data, None)
    finally:
        errors = stop(d)
    assert errors == []
