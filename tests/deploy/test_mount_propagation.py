"""The Kubernetes mount layout (deploy/kubernetes) with real mounts and a real tierd, the
kubelet's part played by bind mounts: a hostPath volume is a recursive bind of the node's
directory; ``Bidirectional`` makes it a peer of the node's mount (shared), and
``HostToContainer`` a slave of it.  Needs root, /dev/fuse and mount(8)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tierd_fuse.mount import find_mount

from .test_manifests import configmap_toml

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse") or shutil.which("mount") is None,
    reason="needs root, /dev/fuse and mount(8)")


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """node: the node's /mnt/tierd (a shared mount, as on systemd hosts); ctr: tierd's
    Bidirectional volume; pod: a training pod's HostToContainer volume; pinned: a pod
    whose hostPath is the FUSE mount itself."""
    paths = {name: tmp_path / name for name in ("node", "ctr", "pod", "pinned")}
    for p in paths.values():
        p.mkdir()
    made: list[Path] = []
    try:
        sh("mount", "--bind", str(paths["node"]), str(paths["node"]))
        made.append(paths["node"])
        sh("mount", "--make-shared", str(paths["node"]))
        sh("mount", "--rbind", str(paths["node"]), str(paths["ctr"]))  # Bidirectional
        made.append(paths["ctr"])
        sh("mount", "--rbind", str(paths["node"]), str(paths["pod"]))
        made.append(paths["pod"])
        sh("mount", "--make-rslave", str(paths["pod"]))  # HostToContainer
        yield paths
    finally:
        for p in [paths["pinned"], *reversed(made)]:
            if find_mount(p) is not None:
                with contextlib.suppress(subprocess.CalledProcessError):
                    sh("umount", "-R", "-l", str(p))


def start(data: Path, mount: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    proc = subprocess.Popen(
        [str(BIN / "tierd"), "serve", "--data-dir", str(data), "--mount", str(mount),
         "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc
        with contextlib.suppress(OSError, ValueError, KeyError):
            if json.loads((data / "endpoints.json").read_text())["pid"] == proc.pid:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("tierd did not start")


def test_tierd_refuses_to_mount_on_the_volume_itself(layout: dict[str, Path],
                                                     tmp_path: Path) -> None:
    proc = start(tmp_path / "data", layout["ctr"])
    assert proc.wait(timeout=30) == 1
    assert proc.stderr is not None and b"is busy" in proc.stderr.read()


def test_mount_below_the_volume_reaches_node_and_pods_across_a_restart(
    layout: dict[str, Path], tmp_path: Path
) -> None:
    sub = Path(configmap_toml()["mount"]).name  # "fs": /mnt/tierd/fs
    data = tmp_path / "data"
    proc = start(data, layout["ctr"] / sub)
    try:
        assert proc.poll() is None
        (layout["ctr"] / sub / "propbucket").mkdir()
        (layout["ctr"] / sub / "propbucket" / "f").write_bytes(b"seen everywhere\n")
        for view in ("node", "pod"):
            assert (layout[view] / sub / "propbucket" / "f").read_bytes() == b"seen everywhere\n"
        sh("mount", "--rbind", str(layout["node"] / sub), str(layout["pinned"]))
        sh("mount", "--make-rslave", str(layout["pinned"]))

        proc.send_signal(signal.SIGKILL)  # tierd's container dies ...
        proc.wait()
        with pytest.raises(OSError) as info:  # (a stat may come from the kernel's cache)
            os.listdir(layout["pod"] / sub / "propbucket")
        assert info.value.errno == errno.ENOTCONN
        proc = start(data, layout["ctr"] / sub)  # ... and its replacement mounts again
        assert proc.poll() is None
        # the pod with the parent directory sees the new mount, without restarting
        assert (layout["pod"] / sub / "propbucket" / "f").read_bytes() == b"seen everywhere\n"
        # the one that bound the mount itself is left on the dead connection
        with pytest.raises(OSError) as info:
            os.listdir(layout["pinned"] / "propbucket")
        assert info.value.errno == errno.ENOTCONN

        proc.send_signal(signal.SIGTERM)  # a clean stop unmounts everywhere
        assert proc.wait(timeout=60) == 0
        for view in ("ctr", "node", "pod"):
            assert find_mount(layout[view] / sub) is None, view
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
