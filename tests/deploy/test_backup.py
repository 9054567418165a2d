"""The backup and recovery procedures of docs/operations.md, run against real daemons: a hot
copy of the metadata while tierd takes writes (deploy/backup/tierd-meta-backup.py), an
offline copy of the data directory restored on another "node", a lost node replaced by an
empty data directory on the same cold store -- and the restore that does not work yet."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from tierd.meta import MetaStore

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
BACKUP = ROOT / "deploy" / "backup" / "tierd-meta-backup.py"
ROOT_KEY, ROOT_SECRET = "deploy-root-key", "deploy-root-secret-0123456789"
BIG = 3 << 20  # larger than a small write: its bytes live only in the hot tier's file


class Node:
    """``tierd serve`` on one data directory, with a cold store that outlives it."""

    def __init__(self, data_dir: Path, cold: Path, *extra: str) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
        env |= {"TIERD_ROOT_ACCESS_KEY": ROOT_KEY, "TIERD_ROOT_SECRET_KEY": ROOT_SECRET,
                "TIERD_COLD_URL": f"file://{cold}"}
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "tierd"), "serve", "--data-dir", str(data_dir),
                 "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", *extra],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                doc = json.loads((data_dir / "endpoints.json").read_text())
                if doc["pid"] == self.proc.pid:
                    self.url = str(doc["s3"]["url"])
                    return
            except (OSError, ValueError, KeyError):
                pass
            assert time.monotonic() < deadline, self.log_path.read_text()
            time.sleep(0.05)

    def s3(self, key: str = ROOT_KEY, secret: str = ROOT_SECRET, timeout: float = 20) -> Any:
        return boto3.client(
            "s3", endpoint_url=self.url, aws_access_key_id=key, aws_secret_access_key=secret,
            region_name="us-east-1",
            config=BotoConfig(retries={"max_attempts": 1}, read_timeout=timeout))

    def tierctl(self, *args: str) -> str:
        r = subprocess.run([str(BIN / "tierctl"), "--data-dir", str(self.data_dir), *args],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def nodes() -> Any:
    started: list[Node] = []

    def start(data_dir: Path, cold: Path, *extra: str) -> Node:
        started.append(Node(data_dir, cold, *extra))
        return started[-1]

    yield start
    for n in started:
        n.stop(signal.SIGKILL)


def body(i: int, size: int = BIG) -> bytes:
    return bytes([i % 251]) * size


def test_hot_metadata_copy_while_writing_holds_every_acknowledged_put(
    tmp_path: Path, nodes: Any
) -> None:
    node = nodes(tmp_path / "a", tmp_path / "cold")
    s3 = node.s3()
    s3.create_bucket(Bucket="hot-copy")
    acked: list[tuple[float, str]] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            key = f"obj-{i:05d}"
            s3.put_object(Bucket="hot-copy", Key=key, Body=b"x" * 100)
            acked.append((time.monotonic(), key))
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        while len(acked) < 50:
            time.sleep(0.01)
        began = time.monotonic()
        r = subprocess.run([sys.executable, str(BACKUP), str(node.data_dir),
                            str(tmp_path / "backup")], capture_output=True, text=True,
                           timeout=120)
        ended = time.monotonic()
        while len([a for a in acked if a[0] > ended]) < 20:  # writes went on after it
            time.sleep(0.01)
    finally:
        stop.set()
        t.join()
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "backup" / "secrets.key").read_bytes() == \
        (node.data_dir / "secrets.key").read_bytes()
    assert node.stop() == 0

    copy = MetaStore.open_lmdb(tmp_path / "backup" / "meta")
    try:
        with copy.snapshot() as tx:
            bucket = tx.get_bucket("hot-copy")
            assert bucket is not None
            names = {n.decode() for n, _, _ in tx.list_dirents(bucket.ino)}
            inodes = sum(1 for _ in tx.iter_inodes())
            assert tx.counter("inodes") == inodes  # one consistent state, counters included
    finally:
        copy.close()
    before = {k for at, k in acked if at < began}
    assert before <= names, sorted(before - names)[:5]
    assert names <= {k for _, k in acked} | {f"obj-{len(acked):05d}"}
    assert len(names) < len(acked)  # the copy is a point in time, not the end state


def test_offline_copy_of_the_data_directory_restores_on_another_node(
    tmp_path: Path, nodes: Any
) -> None:
    cold = tmp_path / "cold"
    a = nodes(tmp_path / "a", cold)
    a.tierctl("user", "add", "alice", "--uid", "1000")
    doc = json.loads(a.tierctl("key", "add", "alice", "--json"))
    key, secret = doc["access_key"], doc["secret"]
    alice = a.s3(key, secret)
    alice.create_bucket(Bucket="offline")  # hers: uid 1000 owns it
    for i in range(3):
        alice.put_object(Bucket="offline", Key=f"big-{i}", Body=body(i))
    alice.put_object(Bucket="offline", Key="small", Body=b"small\n")
    assert a.stop() == 0  # systemctl stop tierd

    shutil.copytree(a.data_dir, tmp_path / "b", symlinks=True)  # cp -a DATA_DIR NEW
    shutil.rmtree(a.data_dir)  # the old node is gone
    b = nodes(tmp_path / "b", cold)
    alice = b.s3(key, secret)  # keys survive: metadata + secrets.key
    for i in range(3):
        assert alice.get_object(Bucket="offline", Key=f"big-{i}")["Body"].read() == body(i)
    assert alice.get_object(Bucket="offline", Key="small")["Body"].read() == b"small\n"


def test_lost_node_replaced_by_an_empty_data_directory_on_the_same_cold_store(
    tmp_path: Path, nodes: Any
) -> None:
    cold = tmp_path / "cold"
    a = nodes(tmp_path / "a", cold, "--persist-delay", "3600")
    a.tierctl("user", "add", "bob", "--uid", "1001")
    doc = json.loads(a.tierctl("key", "add", "bob", "--json"))
    s3 = a.s3()
    s3.create_bucket(Bucket="lost")
    for i in range(3):
        s3.put_object(Bucket="lost", Key=f"ds/shard-{i}", Body=body(i))
    assert "persisted" in a.tierctl("persist", "--wait")
    s3.put_object(Bucket="lost", Key="ds/not-yet-persisted", Body=body(9))
    a.stop(signal.SIGKILL)
    shutil.rmtree(a.data_dir)  # the node and its disks are gone

    b = nodes(tmp_path / "b", cold)
    s3 = b.s3()  # the root key: from the environment again
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="lost")["Contents"]]
    assert keys == [f"ds/shard-{i}" for i in range(3)]  # imported from cold, no copy step
    for i in range(3):
        assert s3.get_object(Bucket="lost", Key=f"ds/shard-{i}")["Body"].read() == body(i)
    # what lived only in the metadata is gone: users and their keys
    with pytest.raises(ClientError) as info:
        b.s3(doc["access_key"], doc["secret"]).list_buckets()
    assert info.value.response["Error"]["Code"] == "InvalidAccessKeyId"


def test_metadata_copy_restored_without_the_hot_tier_reads_from_cold(
    tmp_path: Path, nodes: Any
) -> None:
    cold = tmp_path / "cold"
    a = nodes(tmp_path / "a", cold, "--persist-delay", "0")
    s3 = a.s3()
    s3.create_bucket(Bucket="restore")
    s3.put_object(Bucket="restore", Key="big", Body=body(1))
    assert "persisted" in a.tierctl("persist", "--wait")
    r = subprocess.run([sys.executable, str(BACKUP), str(a.data_dir), str(tmp_path / "bak")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    a.stop(signal.SIGKILL)
    shutil.rmtree(a.data_dir)

    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "bak" / "meta", tmp_path / "b" / "meta")
    shutil.copy2(tmp_path / "bak" / "secrets.key", tmp_path / "b" / "secrets.key")
    b = nodes(tmp_path / "b", cold)
    # placement checks the hot tier against the metadata at start (it used to trust the
    # metadata: the response's headers came, its body never did)
    assert b.s3(timeout=5).get_object(Bucket="restore", Key="big")["Body"].read() == body(1)


def test_the_daemonsets_prestop_hook_pushes_dirty_data_to_cold(tmp_path: Path,
                                                                nodes: Any) -> None:
    """The DaemonSet's preStop command, run as the kubelet would (in the container, where
    ``--data-dir`` is the daemon's data directory)."""
    from .test_manifests import tierd_container

    cold = tmp_path / "cold"
    node = nodes(tmp_path / "a", cold, "--persist-delay", "3600")
    s3 = node.s3()
    s3.create_bucket(Bucket="prestop")
    s3.put_object(Bucket="prestop", Key="ckpt/step-1", Body=body(7))
    assert not (cold / "prestop" / "ckpt" / "step-1").exists()  # dirty: waits an hour
    cmd = list(tierd_container()["lifecycle"]["preStop"]["exec"]["command"])
    cmd[cmd.index("--data-dir") + 1] = str(node.data_dir)
    cmd[0] = str(BIN / cmd[0])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if not k.startswith("TIERD_")})
    assert r.returncode == 0, r.stderr
    assert (cold / "prestop" / "ckpt" / "step-1").read_bytes() == body(7)
