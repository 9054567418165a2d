"""The daemon under torture (see ``bench/torture.py``): ``tierd serve --mount`` on one data
directory, started again after every SIGKILL, its dead mount lazily unmounted; optionally run
from a ``git archive`` of one commit so the edited working tree does not disturb a long run.

Nothing of tierd is imported here: the daemon may run another tree than the harness.
``bench/torture.py`` puts ``tests/`` (``moto_server``) and ``bench/`` on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
from benchlib import admin_call
from botocore.config import Config
from moto_server import REGION, free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ROOT_KEY = "TORTUREROOTKEY01"
ROOT_SECRET = "torture-root-secret-0123456789"
START_TIMEOUT = 60.0


def mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point now (``/proc/self/mountinfo``; a dead FUSE mount
    counts).  The harness imports nothing of tierd: the daemon may run another tree."""
    target = os.path.abspath(path).encode().decode("unicode_escape")
    with open("/proc/self/mountinfo") as f:
        return any(len(ln.split()) > 4 and
                   ln.split()[4].encode().decode("unicode_escape") == target for ln in f)


def unmount_lazily(path: Path) -> None:
    """``fusermount3 -uz`` (``umount -l`` when that fails): a killed daemon's mount."""
    for cmd in (["fusermount3", "-uz", str(path)], ["umount", "-l", str(path)]):
        if not mounted(path):
            return
        subprocess.run(cmd, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    if mounted(path):
        raise RuntimeError(f"cannot unmount {path}")


def snapshot(rev: str, work: Path) -> tuple[Path, str]:
    """``git archive`` of ``rev`` into ``work/src`` and a directory that imports tierd,
    tierd_fuse and tierd_client from it (PYTHONPATH wins over the editable install's
    finder): the daemon runs one commit while others edit the working tree.  Returns (that
    directory, the full commit id)."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", rev], check=True,
                            capture_output=True, text=True).stdout.strip()
    src, farm = work / "src", work / "py"
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(farm, ignore_errors=True)
    src.mkdir(parents=True)
    farm.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    for name, sub in (("tierd", "tierd"), ("tierd_fuse", "fuse"), ("tierd_client", "clients")):
        (farm / name).symlink_to(src / sub)
    return farm, commit


class StartFailed(Exception):
    """The daemon did not come back on its data directory."""


class Tierd:
    """``tierd serve --mount`` on one data directory, started again after every kill."""

    def __init__(self, work: Path, extra: list[str], python_path: Path | None) -> None:
        self.work = work
        self.python_path = python_path
        self.data = work / "data"
        self.mnt = work / "mnt"
        self.logs = work / "logs"
        self.extra = extra
        self.ports = (free_port(), free_port())
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.logs / "none.log"
        self.starts = 0

    @property
    def s3_url(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.ports[1]}"

    def start(self, label: str) -> None:
        for d in (self.data, self.mnt, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.log_path = self.logs / f"{label}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
        env.update(TIERD_ROOT_ACCESS_KEY=ROOT_KEY, TIERD_ROOT_SECRET_KEY=ROOT_SECRET)
        if self.python_path is not None:
            env["PYTHONPATH"] = str(self.python_path)
        cmd = [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(self.data),
               "--mount", str(self.mnt), "--s3-listen", f"127.0.0.1:{self.ports[0]}",
               "--admin-listen", f"127.0.0.1:{self.ports[1]}", *self.extra]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=self.work)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StartFailed(f"tierd exited with {self.proc.returncode}")
            try:
                doc = json.loads((self.data / "endpoints.json").read_text())
            except (OSError, ValueError):
                doc = {}
            if doc.get("pid") == self.proc.pid and "mount" in doc and mounted(self.mnt):
                return
            time.sleep(0.05)
        self.proc.kill()
        raise StartFailed(f"tierd was not ready within {START_TIMEOUT:g} s")

    def unmount(self) -> None:
        unmount_lazily(self.mnt)

    def stop(self) -> int | None:
        """SIGTERM (SIGKILL after 30 s); the mount is gone afterwards."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.unmount()
        return None if self.proc is None else self.proc.returncode

    def admin(self, method: str, path: str, doc: dict[str, Any] | None = None,
              timeout: float = 120.0) -> Any:
        return admin_call(self.admin_url, self.data, method, path, doc, timeout)

    def log_lines(self, path: Path | None = None) -> list[str]:
        try:
            return (path or self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return []


def s3_client(url: str, key: str, secret: str, timeout: float) -> Any:
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=key,
                        aws_secret_access_key=secret, region_name=REGION,
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1}, connect_timeout=5,
                                      read_timeout=timeout, max_pool_connections=10))
