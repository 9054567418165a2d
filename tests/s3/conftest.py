"""Fixtures of the S3 gateway suites: one real ``tierd serve`` subprocess per module (on
127.0.0.1 ephemeral ports) and real boto3 clients talking HTTP to it.

The daemon gets known root credentials through ``TIERD_ROOT_ACCESS_KEY``/``SECRET_KEY``; a
second, unprivileged user (uid 1000) is written into the metadata store before it starts.
Virtual-host style is served under ``s3.test``; clients reach it through the daemon used as
an HTTP proxy, so no DNS name is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tierd.meta import AccessKey, MetaStore

ROOT_KEY = "TIERDTESTROOT"
ROOT_SECRET = "tierd-test-root-secret-0123456789"
USER_KEY = "TIERDTESTALICE"
USER_SECRET = "tierd-test-alice-secret-0123456789"
DOMAIN = "s3.test"
REGION = "us-east-1"


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log: Path
    url: str = ""

    def client(self, key: str = ROOT_KEY, secret: str = ROOT_SECRET, **cfg: Any) -> Any:
        opts: dict[str, Any] = {"signature_version": "s3v4",
                                "s3": {"addressing_style": "path"},
                                "retries": {"max_attempts": 1}}
        opts.update(cfg)
        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id=key,
                            aws_secret_access_key=secret, region_name=REGION,
                            config=Config(**opts))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def add_user_key(data_dir: Path, key: str, secret: str, uid: int, user: str) -> None:
    """Write an access key into the (stopped) daemon's metadata store."""
    (data_dir / "meta").mkdir(parents=True, exist_ok=True)
    store = MetaStore.open_lmdb(data_dir / "meta")
    try:
        with store.write() as tx:
            tx.put_access_key(AccessKey(key, secret, uid, uid, [], user))
    finally:
        store.close()


def start_daemon(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Daemon:
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
        env.update(TIERD_ROOT_ACCESS_KEY=ROOT_KEY, TIERD_ROOT_SECRET_KEY=ROOT_SECRET)
    log = data_dir.parent / f"{data_dir.name}.log"
    cmd = [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(data_dir),
           "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
           "--s3-domain", DOMAIN, *args]
    with open(log, "ab") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
    d = Daemon(proc, data_dir, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tierd exited with {proc.returncode}:\n{log.read_text()}")
        try:
            doc = json.loads((data_dir / "endpoints.json").read_text())
        except (FileNotFoundError, ValueError):
            doc = {}
        if doc.get("pid") == proc.pid:
            d.url = doc["s3"]["url"]
            return d
        time.sleep(0.05)
    d.stop()
    raise RuntimeError(f"tierd did not start:\n{log.read_text()}")


@pytest.fixture(scope="package")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    data_dir = tmp_path_factory.mktemp("s3") / "data"
    add_user_key(data_dir, USER_KEY, USER_SECRET, 1000, "alice")
    d = start_daemon(data_dir)
    yield d
    d.stop()
    text = d.log.read_text(errors="replace")
    assert "Traceback" not in text, text[-5000:]
    # the whole S3 suite's log: the secrets of both keys never appear (tests/admin checks
    # every key the admin API makes, at debug level)
    assert ROOT_SECRET not in text and USER_SECRET not in text, "a secret in the log"


@pytest.fixture(scope="package")
def s3(daemon: Daemon) -> Any:
    return daemon.client()


@pytest.fixture(scope="package")
def alice(daemon: Daemon) -> Any:
    return daemon.client(USER_KEY, USER_SECRET)


def admin_call(daemon: Daemon, method: str, path: str, body: Any = None) -> Any:
    """A call of the daemon's admin API with its token (the JSON answer; 2xx expected)."""
    import requests

    doc = json.loads((daemon.data_dir / "endpoints.json").read_text())
    token = (daemon.data_dir / "admin-token").read_text().strip()
    r = requests.request(method, doc["admin"]["url"] + path, json=body, timeout=10,
                         headers={"Authorization": f"Bearer {token}"})
    assert r.status_code < 300, r.text
    return r.json()


def new_user(daemon: Daemon, prefix: str, uid: int) -> Any:
    """A new user (a unique name from ``prefix``, ``uid``) and a boto3 client of its key."""
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    admin_call(daemon, "POST", "/v1/users", {"name": name, "uid": uid})
    key = admin_call(daemon, "POST", "/v1/keys", {"user": name})
    return daemon.client(key["access_key"], key["secret"])


def empty_bucket(client: Any, name: str) -> None:
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        ups = client.list_multipart_uploads(Bucket=name).get("Uploads", [])
        for u in ups:
            client.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
        client.delete_bucket(Bucket=name)
    except ClientError:
        pass


@pytest.fixture
def bucket(s3: Any) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name)
    yield name
    empty_bucket(s3, name)


@pytest.fixture
def alice_bucket(alice: Any) -> Iterator[str]:
    """A bucket alice (uid 1000) owns; its policy and contents are removed afterwards."""
    name = f"a-{uuid.uuid4().hex[:16]}"
    alice.create_bucket(Bucket=name)
    yield name
    with contextlib.suppress(ClientError):
        alice.delete_bucket_policy(Bucket=name)
    empty_bucket(alice, name)


def client_error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ClientError:
    with pytest.raises(ClientError) as info:
        fn(*args, **kwargs)
    return info.value


def assert_error(code: str, status: int, fn: Callable[..., Any], *args: Any,
                 **kwargs: Any) -> dict[str, Any]:
    """Call ``fn``; it must fail with S3 error ``code`` and HTTP ``status``."""
    e = client_error(fn, *args, **kwargs)
    resp: dict[str, Any] = e.response
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == status, resp
    assert resp["Error"]["Code"] == code, resp
    return resp
