"""A real ``tierd serve`` per test (its pool socket in a directory every uid can reach) and
helpers to run client code as another user (``setpriv``) or to kill it mid-way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from public_dir import public_tempdir
from s3.conftest import Daemon, start_daemon

OTHER_UID = 1000
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory every user may traverse (a second tenant must reach the socket)."""
    with public_tempdir("tierd-ckpt-") as path:
        yield path


class Tierd:
    def __init__(self, data: Path, *args: str) -> None:
        self.data = data
        self.args = args
        self.d: Daemon = start_daemon(data, "--pool-socket", str(data.parent / "pool.sock"),
                                      *args)

    @property
    def socket(self) -> str:
        return str(self.data.parent / "pool.sock")

    @property
    def admin(self) -> str:
        doc = json.loads((self.data / "endpoints.json").read_text())
        return str(doc["admin"]["url"])

    def admin_call(self, method: str, path: str, doc: dict[str, Any] | None = None
                   ) -> tuple[int, dict[str, Any]]:
        token = (self.data / "admin-token").read_text().strip()
        req = urllib.request.Request(self.admin + path, method=method,
                                     data=None if doc is None else json.dumps(doc).encode(),
                                     headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def kill(self) -> None:
        self.d.proc.kill()
        self.d.proc.wait(10)

    def restart(self) -> None:
        self.d.stop()
        self.d = start_daemon(self.data, "--pool-socket", self.socket, *self.args)

    def stop(self) -> None:
        self.d.stop()
        text = self.d.log.read_text(errors="replace")
        assert "Traceback" not in text, text[-5000:]


@pytest.fixture
def tierd(public_dir: Path) -> Iterator[Tierd]:
    t = Tierd(public_dir / "data", "--pool-capacity", "256MiB")
    yield t
    t.stop()


def python_as(uid: int | None, code: str, *args: str, wait: bool = True,
              ) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    """Run ``code`` in a fresh interpreter (as ``uid`` via setpriv when given)."""
    cmd = [sys.executable, "-c", code, *args]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env["PYTHONPATH"] = str(REPO)
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd="/")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, cwd="/")
