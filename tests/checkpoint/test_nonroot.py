"""A training container's user (uid 1000) reaches the checkpoint service of a root daemon
with no settings: the daemon listens on the shared ``/run/tierd/pool.sock`` (the default
for root with the default data directory), every uid may connect, and the client finds it
without a home directory.  The checkpoint guide's examples then run unchanged as that
user: its Python examples (the training code, SDK and POSIX) as uid 1000 on the shared
socket and the daemon's ``allow_other`` mount, its ``sh`` blocks (``tierctl``: the
operator's steps, with the admin token) as root, in the guide's order."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import pytest
from public_dir import public_tempdir
from s3.conftest import start_daemon
from tierd_fuse.mount import find_mount, unmount

from tierd.config import load_config
from tierd.mempool.wire import SHARED_SOCKET

from .conftest import OTHER_UID, REPO

GUIDE = REPO / "docs" / "checkpoint-guide.md"
BLOCK = re.compile(r"^```(python|sh) test\n(.*?)^```$", re.M | re.S)
SYSTEMD_TOML = REPO / "deploy" / "systemd" / "tierd.toml"
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


def test_the_systemd_set_up_listens_on_the_shared_socket() -> None:
    """Under the shipped unit the data directory is 0700 (``StateDirectoryMode``), so the
    pool socket must be the shared one for training users to reach it."""
    cfg = load_config(env={}, config_file=SYSTEMD_TOML)
    assert cfg.data_dir == Path("/var/lib/tierd") and cfg.pool_socket == SHARED_SOCKET


@dataclass
class Node:
    """The daemon of :func:`shared_daemon`: its private data directory and its mount."""

    data: Path
    mount: Path


@pytest.fixture
def shared_daemon(tmp_path: Path) -> Iterator[Node]:
    """A root daemon on /run/tierd/pool.sock with a FUSE mount, its data directory private
    to root (0700, as in root's home), the mount point where every uid reaches it.  One
    such test at a time on this machine (a lock), and none while a real daemon serves that
    socket."""
    SHARED_SOCKET.parent.mkdir(mode=0o755, exist_ok=True)
    with (open(SHARED_SOCKET.parent / ".tierd-test.lock", "w") as lock,
          public_tempdir("tierd-nonroot-") as public):
        fcntl.flock(lock, fcntl.LOCK_EX)
        if SHARED_SOCKET.exists():
            with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as s:
                s.connect(str(SHARED_SOCKET))  # a live daemon's would accept us
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        mount = public / "mnt"
        mount.mkdir()
        d = start_daemon(private / "data", "--pool-socket", str(SHARED_SOCKET),
                         "--pool-capacity", "256MiB", "--mount", str(mount))
        try:
            deadline = time.monotonic() + 30
            while find_mount(mount) is None:
                assert time.monotonic() < deadline, "the mount did not appear"
                time.sleep(0.05)
            yield Node(private / "data", mount)
        finally:
            d.stop()
            if find_mount(mount) is not None:
                unmount(mount, lazy=True)
            text = d.log.read_text(errors="replace")
            assert "Traceback" not in text, text[-4000:]


def as_user(code: str, mount: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter as uid 1000: no TIERD_* variables (but the mount's
    ``TIERD_MOUNT``, as the guide's examples are run), no usable home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERD_", "XDG_"))}
    env.update(HOME="/nonexistent", PYTHONPATH=str(REPO))
    if mount is not None:
        env["TIERD_MOUNT"] = str(mount)
    cmd = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
           sys.executable, "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd="/")


def as_operator(code: str, data: Path) -> subprocess.CompletedProcess[str]:
    """A guide ``sh`` block as root, the daemon's user: ``tierctl`` finds the daemon and
    its admin token in the data directory, tierd's tools on the PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["TIERD_DATA_DIR"] = str(data)
    return subprocess.run(["bash", "-euc", code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=REPO)


@needs_root
def test_the_guide_runs_as_uid_1000_on_the_shared_socket(shared_daemon: Node) -> None:
    mode = stat.S_IMODE(os.stat(SHARED_SOCKET).st_mode)
    assert mode == 0o666 and stat.S_IMODE(os.stat(SHARED_SOCKET.parent).st_mode) & 0o005
    found = as_user("from tierd_client.pool import default_socket; print(default_socket())")
    assert found.returncode == 0 and found.stdout.strip() == str(SHARED_SOCKET), found.stderr
    examples = BLOCK.findall(GUIDE.read_text())
    assert sum(lang == "python" for lang, _ in examples) >= 5
    out = []
    for lang, code in examples:
        if lang == "python":
            r = as_user(code, shared_daemon.mount)
        else:
            r = as_operator(code, shared_daemon.data)
        assert r.returncode == 0, f"{lang} as {'uid 1000' if lang == 'python' else 'root'}:"\
            f"\n{code}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr[-3000:]}"
        out.append(r.stdout)
    # the POSIX example wrote as uid 1000, into the bucket the operator gave it, on the mount
    ckpt = shared_daemon.mount / "posix-guide" / "ckpt"
    saved = ckpt / "step-10.pt"
    assert (os.stat(saved).st_uid, os.stat(ckpt).st_uid) == (OTHER_UID, OTHER_UID)
    assert stat.S_IMODE(os.stat(ckpt.parent).st_mode) == 0o700  # theirs alone
    assert os.listdir(ckpt) == ["step-10.pt"]  # the temporary name was renamed away
    assert f"as uid {OTHER_UID}" in "".join(out)
    assert "bytes in pool memory:" in "".join(out)
    back = as_user(f"import torch; s = torch.load({str(saved)!r}, weights_only=True); "
                   "print(s['step'], tuple(s['model']['weight'].shape))")
    assert back.returncode == 0 and back.stdout.strip() == "10 (512, 512)", back.stderr
    # another uid's training job cannot read uid 1000's checkpoint
    other = subprocess.run(["setpriv", "--reuid=1001", "--regid=1001", "--clear-groups",
                            "cat", str(saved)], capture_output=True, timeout=60)
    assert other.returncode != 0 and b"Permission denied" in other.stderr
    who = as_user("import os, sys; from tierd_client.pool import PoolClient\n"
                  "print(PoolClient().stats()['tenants'])")
    assert f'"{OTHER_UID}"' in who.stdout or f"'{OTHER_UID}'" in who.stdout, who
