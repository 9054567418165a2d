"""A training container's user (uid 1000) reaches the checkpoint service of a root daemon
with no settings: the daemon listens on the shared ``/run/tierd/pool.sock`` (the default
for root with the default data directory), every uid may connect, and the client finds it
without a home directory.  The checkpoint guide's SDK examples then run unchanged as that
user (the POSIX one is left out: it needs the mount and an operator's ``tierctl``)."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest
from s3.conftest import start_daemon

from tierd.config import load_config
from tierd.mempool.wire import SHARED_SOCKET

from .conftest import OTHER_UID, REPO

GUIDE = REPO / "docs" / "checkpoint-guide.md"
BLOCK = re.compile(r"^```python test\n(.*?)^```$", re.M | re.S)
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv for a second uid")


def test_root_with_the_default_data_dir_listens_on_the_shared_socket() -> None:
    cfg = load_config(env={})
    if os.geteuid() == 0:
        assert cfg.data_dir == Path(platformdirs.user_data_dir("tierd"))
        assert cfg.pool_socket == SHARED_SOCKET == Path("/run/tierd/pool.sock")
    else:
        assert cfg.pool_socket == cfg.data_dir / "pool.sock"
    other = load_config(env={"TIERD_DATA_DIR": "/srv/tierd"})
    assert other.pool_socket == Path("/srv/tierd/pool.sock")  # a data dir of one's own
    assert load_config(env={"TIERD_POOL_SOCKET": "/x/p.sock"}).pool_socket == Path("/x/p.sock")


@pytest.fixture
def shared_daemon(tmp_path: Path) -> Iterator[Path]:
    """A daemon on /run/tierd/pool.sock, its data directory private to root (0700, as in
    root's home).  One such test at a time on this machine (a lock), and none while a real
    daemon serves that socket."""
    SHARED_SOCKET.parent.mkdir(mode=0o755, exist_ok=True)
    with open(SHARED_SOCKET.parent / ".tierd-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if SHARED_SOCKET.exists():
            with pytest.raises(OSError):  # a live daemon's would accept us
                import socket

                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(str(SHARED_SOCKET))
                finally:
                    s.close()
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        d = start_daemon(private / "data", "--pool-socket", str(SHARED_SOCKET),
                         "--pool-capacity", "256MiB")
        try:
            yield private / "data"
        finally:
            d.stop()
            text = d.log.read_text(errors="replace")
            assert "Traceback" not in text, text[-4000:]


def as_user(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter as uid 1000: no TIERD_* variables, no usable home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERD_", "XDG_"))}
    env.update(HOME="/nonexistent", PYTHONPATH=str(REPO))
    cmd = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
           sys.executable, "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd="/")


@needs_root
def test_the_guide_runs_as_uid_1000_on_the_shared_socket(shared_daemon: Path) -> None:
    mode = stat.S_IMODE(os.stat(SHARED_SOCKET).st_mode)
    assert mode == 0o666 and stat.S_IMODE(os.stat(SHARED_SOCKET.parent).st_mode) & 0o005
    found = as_user("from tierd_client.pool import default_socket; print(default_socket())")
    assert found.returncode == 0 and found.stdout.strip() == str(SHARED_SOCKET), found.stderr
    examples = [c for c in BLOCK.findall(GUIDE.read_text()) if "tierd_mount" not in c]
    assert len(examples) >= 4
    for code in examples:
        r = as_user(code)
        assert r.returncode == 0, f"{code}\n--- stderr\n{r.stderr[-3000:]}"
    who = as_user("import os, sys; from tierd_client.pool import PoolClient\n"
                  "print(PoolClient().stats()['tenants'])")
    assert f'"{OTHER_UID}"' in who.stdout or f"'{OTHER_UID}'" in who.stdout, who
