"""A real ``tierd serve`` for the tierctl suite: a ``file://`` cold store with a small data
set, a warm tier and a memory pool, so every tier and the pool show in ``tierctl status``.
Writes wait 60 s before upload (a persist command hurries them), so what is dirty stays
dirty while a test looks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from admin.conftest import Admin, start_admin
from s3.conftest import ROOT_KEY, ROOT_SECRET

#: the data set in cold (key under the "dset" bucket -> size)
FILES = {"set/a.bin": 300_000, "set/b.bin": 1_000, "set/sub/c.bin": 70_000}


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Admin, Path]]:
    base = tmp_path_factory.mktemp("cli")
    cold = base / "cold"
    for key, size in FILES.items():
        path = cold / "dset" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(TIERD_ROOT_ACCESS_KEY=ROOT_KEY, TIERD_ROOT_SECRET_KEY=ROOT_SECRET,
               TIERD_COLD_URL=f"file://{cold}", TIERD_WARM_ENABLED="true",
               TIERD_POOL_CAPACITY="64MiB", TIERD_PERSIST_DELAY="60")
    a = start_admin(base / "data", env=env)
    yield a, cold
    a.d.stop()
    assert "Traceback" not in a.log(), a.log()[-5000:]


def run_ctl(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
            ) -> subprocess.CompletedProcess[str]:
    """``tierctl ARGS`` with a clean environment (no TIERD_* of the caller), ``stdin`` on
    its standard input."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "tierd_client.tierctl", *args],
                          capture_output=True, text=True, timeout=60, env=base,
                          input=stdin if stdin is not None else "")
