"""No secret ever reaches the log or a file in clear (other than the two files whose job it
is: ``root-credentials`` and ``admin-token``).

A daemon at debug level (every request logged) gets users and keys created through the admin
API (token and SigV4), keys used over S3 with good and bad signatures, presigned URLs,
disabled and deleted keys, tierctl; then its whole log and every file it wrote -- the
metadata store included: secrets are encrypted before they are stored -- are searched for
every secret, the admin token and the root secret.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import requests
from botocore.exceptions import ClientError
from s3.conftest import ROOT_KEY, ROOT_SECRET

from .conftest import start_admin
from .test_users import s3_client, signed

ALLOWED = {"root-credentials": {ROOT_SECRET}, "admin-token": set()}


def test_secrets_never_logged_or_stored_in_clear(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(TIERD_ROOT_ACCESS_KEY=ROOT_KEY, TIERD_ROOT_SECRET_KEY=ROOT_SECRET,
               TIERD_LOG_LEVEL="debug")
    a = start_admin(data, env=env)
    token = a.token
    secrets: set[str] = {ROOT_SECRET}
    try:
        root = s3_client(a, ROOT_KEY, ROOT_SECRET)
        bucket = f"sec-{uuid.uuid4().hex[:8]}"
        root.create_bucket(Bucket=bucket, ACL="public-read-write")  # shared on purpose

        # users and keys: through the token, through SigV4 of the root user, through tierctl
        assert a.call("POST", "/v1/users", {"name": "sally", "uid": 3100})[0] == 201
        body = json.dumps({"name": "sam", "uid": 3101, "admin": True}).encode()
        assert signed(a, "POST", "/v1/users", ROOT_KEY, ROOT_SECRET, body)[0] == 201
        keys = []
        for user in ("sally", "sally", "sam"):
            status, k = a.call("POST", "/v1/keys", {"user": user})
            assert status == 201
            keys.append(k)
        r = a.tierctl("key", "add", "sally", "--json")
        assert r.returncode == 0, r.stderr
        keys.append(json.loads(r.stdout))
        imported = "imported-secret-" + uuid.uuid4().hex
        status, k = a.call("POST", "/v1/keys", {"user": "sam", "access_key":
                                                "AKIMPORTSECRET1", "secret": imported})
        assert status == 201
        keys.append(k)
        secrets |= {k["secret"] for k in keys}

        # used over S3: good signatures, presigned URLs, bad signatures
        for k in keys:
            c = s3_client(a, k["access_key"], k["secret"])
            c.list_buckets()
            c.put_object(Bucket=bucket, Key=f"o-{k['access_key']}", Body=k["access_key"])
            url = c.generate_presigned_url("get_object", Params={
                "Bucket": bucket, "Key": f"o-{k['access_key']}"})
            assert requests.get(url, timeout=10).status_code == 200
            bad = s3_client(a, k["access_key"], k["secret"][::-1])
            try:
                bad.get_object(Bucket=bucket, Key=f"o-{k['access_key']}")
                raise AssertionError("a wrong secret was accepted")
            except ClientError as e:
                assert e.response["Error"]["Code"] == "SignatureDoesNotMatch"
        # the admin API with an admin user's key, good and bad
        sam = keys[2]
        assert signed(a, "GET", "/v1/keys", sam["access_key"], sam["secret"])[0] == 200
        assert signed(a, "GET", "/v1/keys", sam["access_key"], "wrong" + sam["secret"])[0] \
            == 401
        assert a.call("GET", "/v1/status", token=token[::-1])[0] == 401
        # disabled and deleted keys, a deleted user
        a.call("POST", f"/v1/keys/{keys[0]['access_key']}/disable")
        try:
            s3_client(a, keys[0]["access_key"], keys[0]["secret"]).list_buckets()
            raise AssertionError("a disabled key was accepted")
        except ClientError as e:
            assert e.response["Error"]["Code"] == "InvalidAccessKeyId"
        assert a.call("DELETE", f"/v1/keys/{keys[1]['access_key']}")[0] == 200
        assert a.call("DELETE", "/v1/users/sam")[0] == 200
        # listings (answers, not logs) never show a secret either
        listed = json.dumps([a.call("GET", "/v1/keys")[1], a.call("GET", "/v1/users")[1]])
        assert not [s for s in secrets if s in listed]
    finally:
        a.d.stop()

    log = a.log()
    assert "level=debug" in log and "component=s3.access" in log  # it did log at debug
    assert "identity=token" in log and f"key:{ROOT_KEY}" in log  # changes name who did them
    everything = secrets | {token}
    found = [hashlib.sha256(s.encode()).hexdigest()[:12] for s in everything if s in log]
    assert not found, f"secrets in the daemon log (sha256 prefixes {found})"
    # every file the daemon wrote, the metadata store included
    for path in sorted(p for p in data.rglob("*") if p.is_file()):
        content = path.read_bytes()
        allowed = ALLOWED.get(path.name, set())
        if path.name == "admin-token":
            allowed = {token}
        leaked = [hashlib.sha256(s.encode()).hexdigest()[:12] for s in everything - allowed
                  if s.encode() in content]
        assert not leaked, f"{path} holds secrets in clear (sha256 prefixes {leaked})"
    assert token in (data / "admin-token").read_text()
    assert ROOT_SECRET in (data / "root-credentials").read_text()
