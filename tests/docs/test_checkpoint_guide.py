"""docs/checkpoint-guide.md's examples run against a real daemon, as a reader would run them.

The guide's code blocks marked ```` ```python test ```` or ```` ```sh test ```` run in order,
each in a fresh shell, against one ``tierd serve --mount`` (with ``TIERD_DATA_DIR`` and
``TIERD_MOUNT`` set), as a reader runs them: in the checkout, after the guide's
```` ```sh test-setup ```` block (which activates ``.venv``), with nothing of tierd's on the
PATH before it -- a bare ``tierctl`` the guide did not put there fails.  Then the node is
"lost": the daemon is stopped and its data directory deleted, a new daemon starts on an
empty data directory and the same cold store, and the blocks marked
```` ```python test-restore ```` run against it.  The guide's POSIX example, run where no
tierd mount is, fails with ``MountNotFound`` and writes nothing.
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
from tierd_client.mount import DEFAULT_MOUNT, FSTYPE, MountNotFound, mounts, tierd_mount
from tierd_fuse.mount import find_mount, unmount

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "checkpoint-guide.md"
BLOCK = re.compile(r"^```(python|sh) (test|test-restore|test-setup)\n(.*?)^```$", re.M | re.S)


def blocks(kind: str) -> list[tuple[str, str]]:
    return [(lang, code) for lang, k, code in BLOCK.findall(GUIDE.read_text()) if k == kind]


VENV = Path(sys.prefix)


@contextlib.contextmanager
def checkout() -> Iterator[Path]:
    """The directory a reader runs the guide in: this checkout when its ``.venv`` is the
    environment running the tests, else a stand-in holding ``.venv`` (a link to it)."""
    if (REPO / ".venv").resolve() == VENV.resolve():
        yield REPO
        return
    with public_tempdir("tierd-checkout-") as where:
        (where / ".venv").symlink_to(VENV)
        yield where


def reader_env(data: Path, mount: Path | None) -> dict[str, str]:
    """The environment of a reader's fresh shell: no ``TIERD_*`` but those the guide names,
    and nothing of tierd's environment on the PATH until the set-up block activates it."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TIERD_") and k != "VIRTUAL_ENV"}
    bins = {str(VENV / "bin"), str(Path(sys.executable).parent)}
    env["PATH"] = ":".join(p for p in env.get("PATH", "/usr/bin:/bin").split(":")
                           if p and p not in bins)
    env["TIERD_DATA_DIR"] = str(data)
    if mount is not None:
        env["TIERD_MOUNT"] = str(mount)
    return env


def shell_run(lang: str, code: str, data: Path, mount: Path | None
              ) -> subprocess.CompletedProcess[str]:
    """One block in a fresh shell in the checkout, after the set-up block."""
    [(_, setup)] = blocks("test-setup")
    env = reader_env(data, mount)
    env["GUIDE_CODE"] = code
    body = 'exec python -c "$GUIDE_CODE"' if lang == "python" else code
    with checkout() as cwd:
        return subprocess.run(["bash", "-euc", f"{setup}\n{body}"], capture_output=True,
                              text=True, env=env, timeout=300, cwd=cwd)


def run_block(lang: str, code: str, data: Path, mount: Path | None) -> str:
    done = shell_run(lang, code, data, mount)
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
    assert [lang for lang, _ in blocks("test-setup")] == ["sh"]
    main = blocks("test")
    assert len(main) >= 5 and any(lang == "sh" for lang, _ in main)
    assert [lang for lang, _ in blocks("test-restore")] == ["sh", "python"]
    text = "".join(code for _, code in main)
    for needle in ("ck.save(", "wait_persisted(", "ck.load(", "dcp.async_save(",
                   "TierdStorageReader(", "torch.save(", "PoolQuotaExceeded", "tierd_mount()"):
        assert needle in text, needle
    # no fixed mount path to fall back on: a missing mount must fail, not write locally
    assert "/mnt/tierd" not in text and "TIERD_MOUNT\"," not in text


def test_a_bare_tierctl_needs_the_guides_set_up(tmp_path: Path) -> None:
    """The blocks' shells start without tierd's tools: only the set-up block brings them."""
    env = reader_env(tmp_path, None)
    found = shutil.which("tierctl", path=env["PATH"])
    assert found is None or not Path(found).resolve().is_relative_to(VENV.resolve())
    done = shell_run("sh", "command -v tierctl && tierctl --help >/dev/null", tmp_path, None)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve().parent == (VENV / "bin").resolve()


def posix_block() -> str:
    [code] = [code for lang, code in blocks("test") if "torch.save(" in code]
    return code


def test_posix_example_refuses_a_directory_that_is_not_the_mount(tmp_path: Path) -> None:
    """Run where no tierd mount is -- TIERD_MOUNT a plain directory, or unset with no
    daemon -- the guide's torch.save example stops with MountNotFound and writes nothing."""
    plain = tmp_path / "not-a-mount"
    plain.mkdir()
    done = shell_run("python", posix_block(), tmp_path / "no-daemon", plain)
    assert done.returncode != 0
    assert "MountNotFound" in done.stderr and "is not a tierd mount" in done.stderr
    assert "it is a plain directory" in done.stderr, done.stderr[-2000:]
    assert list(plain.iterdir()) == []  # nothing landed on local disk
    default = DEFAULT_MOUNT
    if (str(default), FSTYPE) in mounts():
        return  # this machine has tierd mounted there: nothing to refuse
    before = default.exists() and sorted(default.iterdir())
    done = shell_run("python", posix_block(), tmp_path / "no-daemon", None)
    assert done.returncode != 0 and "MountNotFound" in done.stderr, done.stderr[-2000:]
    assert "/mnt/tierd (from the default" in done.stderr
    assert (default.exists() and sorted(default.iterdir())) == before


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


def test_tierd_mount_says_what_it_found(tmp_path: Path) -> None:
    with pytest.raises(MountNotFound, match=r"from the path given\) is not a tierd mount: "
                       r"it does not exist"):
        tierd_mount(tmp_path / "missing")
    with pytest.raises(MountNotFound, match=r"it is a proc mount, not tierd's"):
        tierd_mount("/proc")
    with pytest.raises(MountNotFound, match=r"from TIERD_MOUNT\) .* plain directory"):
        os.environ["TIERD_MOUNT"] = str(tmp_path)
        try:
            tierd_mount()
        finally:
            del os.environ["TIERD_MOUNT"]
