"""S3 credentials on a cluster: users and keys live in the shared namespace, sealed with a
key derived from the cluster's secret, so a key made through one node's admin API signs
requests to every node; disabling it through one node stops it on every node within the
change feed's delay (each node caches resolved keys: tierd.acl.keys, tierd.cluster)."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from .clusterlib import Cluster, poll


def _client(node: Any, access: str, secret: str) -> Any:
    return boto3.client("s3", endpoint_url=node.doc["s3"]["url"], aws_access_key_id=access,
                        aws_secret_access_key=secret, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1, "mode": "standard"}))


def _refused(client: Any) -> bool:
    try:
        client.list_buckets()
    except ClientError as e:
        return e.response["Error"]["Code"] in ("InvalidAccessKeyId", "AccessDenied")
    return False


def test_a_key_made_on_n1_works_on_n3_until_n2_disables_it(cluster: Cluster) -> None:
    cluster[1].admin("POST", "/v1/users", {"name": "carla", "uid": 4242})
    made = cluster[1].admin("POST", "/v1/keys", {"user": "carla"})
    c3 = _client(cluster[3], made["access_key"], made["secret"])
    c3.list_buckets()  # cached on n3 now
    cluster[2].admin("POST", f"/v1/keys/{made['access_key']}/disable")
    took = poll(lambda: _refused(c3), 5.0)
    assert took < 5.0
    assert _refused(_client(cluster[1], made["access_key"], made["secret"]))
