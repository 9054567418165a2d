"""Multipart uploads of real clients through a load balancer in front of the three nodes
(deploy/compose/docker-compose.cluster.yaml and deploy/kubernetes-cluster/ put one there):
each request goes to the next node in turn, so one upload's create, parts and completion
land on different nodes.  boto3's transfer manager and the AWS CLI upload; reads through the
balancer (ranged GETs, spread too) and on every node give the same bytes back."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from durability.coldlib import S3_KEY, S3_SECRET, FaultProxy
from moto_server import REGION

from .clusterlib import Cluster

pytestmark = pytest.mark.usefixtures("bucket")
BUCKET = "mpulb"
MIB = 1 << 20


class RoundRobin(FaultProxy):
    """:class:`FaultProxy` whose upstream is the next node at every request (it reads
    ``upstream`` once per request it forwards)."""

    def __init__(self, upstreams: list[str]) -> None:
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self._turn = itertools.count()
        self.sent: list[str] = []
        super().__init__(upstreams[0])

    @property  # type: ignore[override]
    def upstream(self) -> str:
        url = self.upstreams[next(self._turn) % len(self.upstreams)]
        self.sent.append(url)
        return url

    @upstream.setter
    def upstream(self, value: str) -> None:
        """(FaultProxy's constructor sets it: the list decides.)"""


@pytest.fixture
def balancer(cluster: Cluster) -> Iterator[RoundRobin]:
    with RoundRobin([cluster[i].doc["s3"]["url"] for i in (1, 2, 3)]) as lb:
        yield lb


def _client(url: str) -> Any:
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=S3_KEY,
                        aws_secret_access_key=S3_SECRET, region_name=REGION,
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1, "mode": "standard"}))


def _same_everywhere(cluster: Cluster, key: str, data: bytes) -> None:
    want = hashlib.sha256(data).hexdigest()
    for i in (1, 2, 3):
        got = cluster[i].s3().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert hashlib.sha256(got).hexdigest() == want, f"n{i} reads other bytes of {key}"


def test_boto3_transfer_manager_through_a_round_robin_balancer(
        cluster: Cluster, balancer: RoundRobin) -> None:
    data = os.urandom(23 * MIB + 5)
    s3 = _client(balancer.url)
    cfg = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB,
                         max_concurrency=4)
    s3.upload_fileobj(io.BytesIO(data), BUCKET, "boto3/big", Config=cfg)
    assert len(set(balancer.sent)) == 3  # create, 5 parts, complete: every node had some
    # ranged reads, each through the next node (the proxy drops a HEAD's length, so the
    # transfer manager's download cannot run behind it)
    got = b"".join(s3.get_object(Bucket=BUCKET, Key="boto3/big",
                                 Range=f"bytes={o}-{o + 8 * MIB - 1}")["Body"].read()
                   for o in range(0, len(data), 8 * MIB))
    assert got == data
    _same_everywhere(cluster, "boto3/big", data)


def test_aws_cli_cp_through_a_round_robin_balancer(
        cluster: Cluster, balancer: RoundRobin, tmp_path: Path) -> None:
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    data = os.urandom(30 * MIB + 7)  # the CLI's 8 MiB parts: 4 of them
    src.write_bytes(data)
    (tmp_path / "credentials").write_text(
        f"[default]\naws_access_key_id = {S3_KEY}\naws_secret_access_key = {S3_SECRET}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIERD_"))}
    env.update(HOME=str(tmp_path), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "credentials"),
               AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_DEFAULT_REGION=REGION,
               AWS_MAX_ATTEMPTS="1")
    aws = [str(Path(sys.executable).parent / "aws"), "--endpoint-url", balancer.url]
    for args in (["s3", "cp", str(src), f"s3://{BUCKET}/cli/big"],
                 ["s3api", "get-object", "--bucket", BUCKET, "--key", "cli/big", str(dst)]):
        r = subprocess.run([*aws, *args], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    assert dst.read_bytes() == data
    _same_everywhere(cluster, "cli/big", data)
