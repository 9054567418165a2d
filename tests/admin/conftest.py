"""Fixtures of the admin API suites: a real ``tierd serve`` (umask 000; what S3 creates is
private all the same, so a test that lets users other than root write into a bucket root
creates gives it a canned ACL), its admin token, an HTTP helper and ``tierctl``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from s3.conftest import Daemon, start_daemon


@dataclass
class Admin:
    """A running daemon seen through its admin API."""

    d: Daemon

    @property
    def data(self) -> Path:
        return self.d.data_dir

    @property
    def url(self) -> str:
        return str(json.loads((self.data / "endpoints.json").read_text())["admin"]["url"])

    @property
    def token(self) -> str:
        return (self.data / "admin-token").read_text().strip()

    def call(self, method: str, path: str, doc: Any = None, token: str | None = "",
             headers: dict[str, str] | None = None, body: bytes | None = None
             ) -> tuple[int, Any]:
        """(status, JSON answer); ``token=""`` uses the daemon's token, None sends none."""
        hdrs = dict(headers or {})
        tok = self.token if token == "" else token
        if tok is not None:
            hdrs["Authorization"] = f"Bearer {tok}"
        data = body if body is not None else (None if doc is None else json.dumps(doc).encode())
        req = urllib.request.Request(self.url + path, method=method, data=data, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    def tierctl(self, *args: str, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
        base.update(env or {})
        return subprocess.run([sys.executable, "-m", "tierd_client.tierctl", "--data-dir",
                               str(self.data), *args], capture_output=True, text=True,
                              timeout=60, env=base)

    def log(self) -> str:
        return self.d.log.read_text(errors="replace")


def start_admin(data: Path, *args: str, env: dict[str, str] | None = None) -> Admin:
    return Admin(start_daemon(data, "--umask", "000", *args, env=env))


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Admin]:
    a = start_admin(tmp_path_factory.mktemp("admin") / "data")
    yield a
    a.d.stop()
    assert "Traceback" not in a.log(), a.log()[-5000:]
