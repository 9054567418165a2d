"""Operator commands end to end: a real ``tierd serve`` and ``tierctl`` subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tierd.tiers import BLOCK_SIZE


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(extra)
    return env


def test_tierctl_placement_commands(tmp_path: Path) -> None:
    data, cold = tmp_path / "data", tmp_path / "cold"
    (cold / "opsx" / "ds").mkdir(parents=True)
    payload = os.urandom(2 * BLOCK_SIZE + 7)
    (cold / "opsx" / "ds" / "a.bin").write_bytes(payload)
    with open(tmp_path / "tierd.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(data),
             "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env=_env(TIERD_COLD_URL=f"file://{cold}", TIERD_WARM_ENABLED="true"))
    try:
        ep = data / "endpoints.json"
        deadline = time.monotonic() + 30
        while not ep.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        url = json.loads(ep.read_text())["admin"]["url"]

        def ctl(*args: str) -> str:
            r = subprocess.run([sys.executable, "-m", "tierd_client.tierctl", *args],
                               capture_output=True, text=True, timeout=60,
                               env=_env(TIERD_ADMIN_URL=url))
            assert r.returncode == 0, r.stderr + r.stdout
            return r.stdout

        assert "imported 2" in ctl("import", "opsx/ds/")
        ctl("warmup", "opsx/ds/")
        du = json.loads(ctl("du", "opsx/", "--json"))
        assert du["tiers"]["hot"] == len(payload) and du["files"] == 1
        ctl("pin", "opsx/ds/")
        assert "pin=True" in ctl("policy", "get")
        assert "evicted 0 B" in ctl("evict", "opsx/")
        ctl("unpin", "opsx/ds/")
        assert "evicted 8.0 MiB" in ctl("evict", "opsx/")
        assert json.loads(ctl("du", "opsx/", "--json"))["tiers"]["hot"] == 0
        ctl("warmup", "opsx/ds/", "--tier", "warm")
        du = json.loads(ctl("du", "opsx/", "--json"))
        assert du["tiers"]["warm"] == len(payload) and du["tiers"]["hot"] == 0
        assert "warm 8.0 MiB" in ctl("du", "opsx/")
        ctl("warmup", "opsx/ds/")  # hot again: copied up from warm
        assert "evicted 8.0 MiB" in ctl("evict", "opsx/", "--tier", "hot")  # warm has it
        assert "evicted 8.0 MiB" in ctl("evict", "opsx/", "--tier", "warm")
        du = json.loads(ctl("du", "opsx/", "--json"))
        assert du["tiers"]["warm"] == du["tiers"]["hot"] == 0
        assert "tier=warm" in ctl("policy", "set", "opsx/ds/", "--tier", "warm").replace(
            '"tier": "warm"', "tier=warm")
        ctl("policy", "set", "opsx/tmp/", "--mode", "cache-only")
        assert "persisted" in ctl("persist", "--wait", "opsx/")
    finally:
        proc.terminate()
        proc.wait(20)
