"""Fixtures for the FUSE door: a real ``tierd serve --mount`` process and real programs.

One daemon serves the whole session (mounting is the slow part); every test works in a
fresh directory of the bucket ``fusetests``.  The daemon is stopped with SIGTERM at the end,
killed if it does not stop, and its mount is lazily unmounted if it is still there, so a
failing test never leaves a mount behind.

The mount point lives in a world-traversable temporary directory (not pytest's 0700 tmp
root) so that permission tests can reach it as other users.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from public_dir import public_tempdir
from tierd_fuse.mount import find_mount, unmount

START_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
BUCKET = "fusetests"
ACCESS_KEY = "FUSETESTKEY"
SECRET_KEY = "fuse-test-secret-key-0123456789"


def fuse_usable() -> str | None:
    """Why FUSE tests cannot run here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing: no FUSE in this machine or container"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = fuse_usable()
    if reason is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=reason))


#: settings the suite hands on to its daemons: ``TIERD_FUSE_BACKEND=pyfuse3`` runs the FUSE
#: tests on the pyfuse3 backend instead of the kernel-protocol one (docs/fuse.md),
#: ``TIERD_FUSE_PASSTHROUGH=false`` turns passthrough off (on by default;
#: ``TIERD_FUSE_PASSTHROUGH_WRITES=false``: for writable opens only)
PASSED_ON = frozenset({"TIERD_FUSE_BACKEND", "TIERD_FUSE_PASSTHROUGH",
                       "TIERD_FUSE_PASSTHROUGH_WRITES"})


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TIERD_") or k in PASSED_ON}
    env.update(extra)
    return env


def tierd_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tierd.cli", *args]


@dataclass
class Daemon:
    """One ``tierd serve --mount`` process."""

    proc: subprocess.Popen[bytes]
    data_dir: Path
    mnt: Path
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def endpoints(self) -> dict[str, object]:
        doc: dict[str, object] = json.loads((self.data_dir / "endpoints.json").read_text())
        return doc


def start_daemon(data_dir: Path, mnt: Path, log_path: Path, *extra: str,
                 crashpoint: str = "") -> Daemon:
    """Start ``tierd serve`` with a mount and wait until the mount answers (``crashpoint``:
    ``TIERD_CRASHPOINT`` for it, tierd/namespace/crashpoint.py)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_f = open(log_path, "ab")  # noqa: SIM115 - the child writes to it until it exits
    proc = subprocess.Popen(
        tierd_cmd("serve", "--data-dir", str(data_dir), "--mount", str(mnt),
                  "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", *extra),
        stdin=subprocess.DEVNULL, stdout=log_f, stderr=log_f,
        env=clean_env(TIERD_ROOT_ACCESS_KEY=ACCESS_KEY, TIERD_ROOT_SECRET_KEY=SECRET_KEY,
                      **({"TIERD_CRASHPOINT": crashpoint} if crashpoint else {})),
    )
    log_f.close()
    d = Daemon(proc, data_dir, mnt, log_path)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tierd exited with {proc.returncode}:\n{d.log}")
        ep = data_dir / "endpoints.json"
        with contextlib.suppress(ValueError, OSError):
            doc = json.loads(ep.read_text())  # a killed daemon's file names another pid
            if doc.get("pid") == proc.pid and "mount" in doc and find_mount(mnt) is not None:
                return d
        time.sleep(0.05)
    stop_daemon(d)
    raise RuntimeError(f"tierd did not mount {mnt} within {START_TIMEOUT} s:\n{d.log}")


def stop_daemon(d: Daemon, sig: int = signal.SIGTERM) -> int | None:
    """Stop the daemon (kill it if it hangs) and make sure no mount is left behind."""
    if d.proc.poll() is None:
        d.proc.send_signal(sig)
        try:
            d.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait(STOP_TIMEOUT)
    if find_mount(d.mnt) is not None:
        with contextlib.suppress(Exception):
            unmount(d.mnt, lazy=True)
    return d.proc.returncode


@pytest.fixture(scope="session")
def public_tmp() -> Iterator[Path]:
    """A temporary directory every user can traverse (for mount points)."""
    with public_tempdir("tierd-fuse-") as path:
        try:
            yield path
        finally:
            for p in path.iterdir():
                if find_mount(p) is not None:
                    with contextlib.suppress(Exception):
                        unmount(p, lazy=True)


@contextlib.contextmanager
def serving(public_tmp: Path, prefix: str, *args: str) -> Iterator[Daemon]:
    """A daemon on ``public_tmp/<prefix>data`` mounted at ``<prefix>mnt`` (extra ``serve``
    arguments: ``args``) with the shared bucket made, stopped at the end (its log printed
    if it exited badly)."""
    d = start_daemon(public_tmp / f"{prefix}data", public_tmp / f"{prefix}mnt",
                     public_tmp / f"{prefix}tierd.log", *args)
    try:
        (d.mnt / BUCKET).mkdir()
        (d.mnt / BUCKET).chmod(0o777)
        yield d
    finally:
        code = stop_daemon(d)
        if code not in (0, None):
            print(f"tierd exited with {code}; log:\n{d.log}", file=sys.stderr)


@pytest.fixture(scope="session")
def daemon(public_tmp: Path) -> Iterator[Daemon]:
    with serving(public_tmp, "") as d:
        yield d


def s3_client(daemon: Daemon, **config: Any) -> Any:
    """A boto3 client of the daemon's S3 door (root's key, path style, no retries);
    ``config`` adds botocore ``Config`` options."""
    import boto3
    from botocore.config import Config

    ep = daemon.endpoints()["s3"]
    assert isinstance(ep, dict)
    return boto3.client(
        "s3", endpoint_url=ep["url"], aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config))


@pytest.fixture(scope="module")
def s3(daemon: Daemon) -> Any:
    """The S3 door of the shared daemon, for tests that cross the two doors."""
    return s3_client(daemon)


_counter = itertools.count()


@pytest.fixture
def work(daemon: Daemon, request: pytest.FixtureRequest) -> Path:
    """A fresh directory inside the mounted bucket, named after the test."""
    name = re.sub(r"[^a-zA-Z0-9_.-]", "_", request.node.name)[:80]
    path = daemon.mnt / BUCKET / f"{name}-{next(_counter)}"
    path.mkdir()
    path.chmod(0o777)
    return path


def run(cmd: list[str], cwd: Path | None = None, timeout: float = 120.0,
        env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a real program; on failure the assertion shows its output."""
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, env=env)
    if check:
        assert r.returncode == 0, f"{cmd} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def need(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        pytest.fail(f"{program} is not installed (dev.sh installs it)")
    return path
