"""Signature Version 2 (tierd/s3/sigv2.py): presigned URLs as botocore makes them by default
for a custom endpoint, the ``aws s3 presign`` and s3cmd forms, and the ``s3_allow_sigv2``
setting (``presigned``, the default daemon's; ``all``, a second daemon here)."""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
from botocore.config import Config

from s3.conftest import (
    DOMAIN,
    REGION,
    ROOT_KEY,
    ROOT_SECRET,
    USER_KEY,
    USER_SECRET,
    Daemon,
    add_user_key,
    start_daemon,
)
from s3.test_clients import clean_env, tool
from tierd.config import SETTINGS
from tierd.config import Config as TierdConfig
from tierd.s3 import sigv2


def v2_client(url: str, key: str = ROOT_KEY, secret: str = ROOT_SECRET,
              **cfg: Any) -> Any:
    """boto3 with botocore's own defaults for a custom endpoint (no signature_version)."""
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=key,
                        aws_secret_access_key=secret, region_name=REGION,
                        config=Config(retries={"max_attempts": 1}, **cfg))


def error_code(r: requests.Response) -> str:
    return r.text.split("<Code>")[1].split("</Code>")[0]


@pytest.fixture(scope="module")
def daemon_all(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon that takes every form of SigV2 (``s3_allow_sigv2 = all``)."""
    data_dir = tmp_path_factory.mktemp("sigv2") / "data"
    add_user_key(data_dir, USER_KEY, USER_SECRET, 1000, "alice")
    d = start_daemon(data_dir, "--s3-allow-sigv2", "all")
    yield d
    d.stop()
    assert "Traceback" not in d.log.read_text(errors="replace")


def test_botocore_default_presigned_url_is_sigv2_and_works(daemon: Daemon, s3: Any,
                                                           bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="a b~+!.txt", Body=b"hello v2")
    url = v2_client(daemon.url).generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "a b~+!.txt"}, ExpiresIn=60)
    assert "AWSAccessKeyId=" in url and "Signature=" in url  # the default is SigV2
    r = requests.get(url, timeout=10)
    assert (r.status_code, r.content) == (200, b"hello v2")


def test_presigned_put_then_head_with_signature_version_s3(daemon: Daemon, s3: Any,
                                                           bucket: str) -> None:
    c = v2_client(daemon.url, signature_version="s3")
    url = c.generate_presigned_url("put_object", Params={
        "Bucket": bucket, "Key": "up", "ContentType": "text/plain"}, ExpiresIn=60)
    r = requests.put(url, data=b"uploaded", headers={"Content-Type": "text/plain"},
                     timeout=10)
    assert r.status_code == 200, r.text
    got = s3.get_object(Bucket=bucket, Key="up")
    assert got["Body"].read() == b"uploaded" and got["ContentType"] == "text/plain"
    head = c.generate_presigned_url("head_object", Params={"Bucket": bucket, "Key": "up"},
                                    ExpiresIn=60, HttpMethod="HEAD")
    r = requests.head(head, timeout=10)
    assert r.status_code == 200 and r.headers["Content-Length"] == "8"


def test_presigned_sub_resources_are_signed(daemon: Daemon, s3: Any, bucket: str) -> None:
    """response-* overrides are part of the SigV2 resource: signed, and honoured."""
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = v2_client(daemon.url, signature_version="s3").generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "k",
                              "ResponseContentType": "image/png"}, ExpiresIn=60)
    r = requests.get(url, timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"] == "image/png"
    r = requests.get(url.replace("image%2Fpng", "text%2Fhtml"), timeout=10)
    assert (r.status_code, error_code(r)) == (403, "SignatureDoesNotMatch")


def test_aws_cli_presign(daemon: Daemon, s3: Any, bucket: str, tmp_path: Path) -> None:
    s3.put_object(Bucket=bucket, Key="cli", Body=b"from the cli")
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {ROOT_KEY}\n"
                     f"aws_secret_access_key = {ROOT_SECRET}\n")
    env = clean_env(tmp_path)
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_DEFAULT_REGION=REGION)
    out = subprocess.run([tool("aws"), "--endpoint-url", daemon.url, "s3", "presign",
                          f"s3://{bucket}/cli"], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert "AWSAccessKeyId=" in out  # the AWS CLI presigns with SigV2 too
    r = requests.get(out, timeout=10)
    assert (r.status_code, r.content) == (200, b"from the cli"), out


def test_expired_presigned_url(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = v2_client(daemon.url).generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=-10)
    r = requests.get(url, timeout=10)
    assert r.status_code == 403 and error_code(r) == "AccessDenied"
    assert "Request has expired" in r.text


def test_wrong_signature_and_unknown_key(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = v2_client(daemon.url, secret="not-the-secret").generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=60)
    r = requests.get(url, timeout=10)
    assert (r.status_code, error_code(r)) == (403, "SignatureDoesNotMatch")
    url = v2_client(daemon.url, key="NOSUCHKEY").generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=60)
    r = requests.get(url, timeout=10)
    assert (r.status_code, error_code(r)) == (403, "InvalidAccessKeyId")


def test_presigned_url_of_another_user_is_judged_as_that_user(daemon: Daemon, s3: Any,
                                                              bucket: str) -> None:
    """The key's identity decides, as for SigV4: alice may not read root's private object."""
    s3.put_object(Bucket=bucket, Key="private", Body=b"x")
    url = v2_client(daemon.url, USER_KEY, USER_SECRET).generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "private"}, ExpiresIn=60)
    r = requests.get(url, timeout=10)
    assert (r.status_code, error_code(r)) == (403, "AccessDenied")


def test_bucket_policy_sees_signature_version(daemon: Daemon, s3: Any, bucket: str) -> None:
    """``s3:signatureversion`` is ``AWS`` for SigV2: a policy can deny SigV2 links."""
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject",
         "Resource": f"arn:aws:s3:::{bucket}/*",
         "Condition": {"StringEquals": {"s3:signatureversion": "AWS"}}}]}))
    try:
        r = requests.get(v2_client(daemon.url).generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=60), timeout=10)
        assert (r.status_code, error_code(r)) == (403, "AccessDenied")
        r = requests.get(s3.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=60), timeout=10)
        assert r.status_code == 200
    finally:
        s3.delete_bucket_policy(Bucket=bucket)


def test_default_refuses_presigned_delete_and_header_sigv2(daemon: Daemon, s3: Any,
                                                           bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    c = v2_client(daemon.url, signature_version="s3")
    url = c.generate_presigned_url("delete_object", Params={"Bucket": bucket, "Key": "k"},
                                   ExpiresIn=60)
    r = requests.delete(url, timeout=10)
    assert (r.status_code, error_code(r)) == (400, "InvalidRequest")
    assert "s3_allow_sigv2 = presigned" in r.text
    with pytest.raises(Exception) as info:
        c.get_object(Bucket=bucket, Key="k")  # header SigV2
    assert "Authorization header" in str(info.value)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"  # not deleted


def test_header_sigv2_with_boto3_when_allowed(daemon_all: Daemon) -> None:
    c = v2_client(daemon_all.url, signature_version="s3", s3={"addressing_style": "path"})
    b = f"v2-{uuid.uuid4().hex[:12]}"
    c.create_bucket(Bucket=b)
    c.put_object(Bucket=b, Key="dir/a~b c", Body=b"v2 body", ContentType="text/x",
                 Metadata={"who": "v2"}, ContentMD5=base64.b64encode(
                     hashlib.md5(b"v2 body").digest()).decode())
    got = c.get_object(Bucket=b, Key="dir/a~b c")
    assert got["Body"].read() == b"v2 body" and got["Metadata"] == {"who": "v2"}
    assert [o["Key"] for o in c.list_objects(Bucket=b, Prefix="dir/")["Contents"]] == [
        "dir/a~b c"]
    assert c.get_object_acl(Bucket=b, Key="dir/a~b c")["Grants"]  # ?acl is signed
    up = c.create_multipart_upload(Bucket=b, Key="mp")  # ?uploads, then ?partNumber&uploadId
    part = c.upload_part(Bucket=b, Key="mp", UploadId=up["UploadId"], PartNumber=1,
                         Body=b"part")
    c.complete_multipart_upload(Bucket=b, Key="mp", UploadId=up["UploadId"], MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert c.get_object(Bucket=b, Key="mp")["Body"].read() == b"part"
    c.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "mp"}, {"Key": "dir/a~b c"}]})
    c.delete_bucket(Bucket=b)


def test_header_sigv2_virtual_host(daemon_all: Daemon) -> None:
    """Virtual-host style: the bucket from the Host is part of the signed resource."""
    path = v2_client(daemon_all.url, signature_version="s3", s3={"addressing_style": "path"})
    b = f"vh-{uuid.uuid4().hex[:12]}"
    path.create_bucket(Bucket=b)
    c = boto3.client("s3", endpoint_url=f"http://{DOMAIN}", aws_access_key_id=ROOT_KEY,
                     aws_secret_access_key=ROOT_SECRET, region_name=REGION,
                     config=Config(signature_version="s3", s3={"addressing_style": "virtual"},
                                   proxies={"http": daemon_all.url},
                                   retries={"max_attempts": 1}))
    c.put_object(Bucket=b, Key="k", Body=b"virtual")
    assert path.get_object(Bucket=b, Key="k")["Body"].read() == b"virtual"
    path.delete_object(Bucket=b, Key="k")
    path.delete_bucket(Bucket=b)


def _raw_v2(url: str, method: str, path: str, headers: dict[str, str],
            secret: str = ROOT_SECRET) -> requests.Response:
    """A SigV2 header request signed here, by the rules written out."""
    amz = "".join(f"{k.lower()}:{v}\n" for k, v in sorted(headers.items())
                  if k.lower().startswith("x-amz-"))
    date = "" if "x-amz-date" in headers else headers.get("Date", "")
    sts = (f"{method}\n{headers.get('Content-MD5', '')}\n{headers.get('Content-Type', '')}\n"
           f"{date}\n{amz}{path}")
    sig = base64.b64encode(hmac.new(secret.encode(), sts.encode(), hashlib.sha1).digest())
    return requests.request(method, url + path, timeout=10, headers={
        **headers, "Authorization": f"AWS {ROOT_KEY}:{sig.decode()}"})


def test_header_sigv2_dates(daemon_all: Daemon) -> None:
    now = email.utils.formatdate(time.time(), usegmt=True)
    r = _raw_v2(daemon_all.url, "GET", "/", {"x-amz-date": now})
    assert r.status_code == 200, r.text  # x-amz-date: an empty Date line
    r = _raw_v2(daemon_all.url, "GET", "/", {"Date": now})
    assert r.status_code == 200, r.text
    old = email.utils.formatdate(time.time() - 3600, usegmt=True)
    r = _raw_v2(daemon_all.url, "GET", "/", {"Date": old})
    assert (r.status_code, error_code(r)) == (403, "RequestTimeTooSkewed")
    r = _raw_v2(daemon_all.url, "GET", "/", {})
    assert (r.status_code, error_code(r)) == (403, "AccessDenied")
    r = requests.get(daemon_all.url + "/", headers={"Authorization": "AWS nocolon",
                                                    "Date": now}, timeout=10)
    assert (r.status_code, error_code(r)) == (400, "InvalidArgument")


def test_s3cmd_signature_v2(daemon_all: Daemon, tmp_path: Path) -> None:
    host = daemon_all.url.removeprefix("http://")
    cfg = tmp_path / "s3cfg"
    cfg.write_text(f"[default]\naccess_key = {ROOT_KEY}\nsecret_key = {ROOT_SECRET}\n"
                   f"host_base = {host}\nhost_bucket = {host}\nuse_https = False\n"
                   f"bucket_location = {REGION}\nsignature_v2 = True\n")
    env = clean_env(tmp_path)

    def run(*args: str) -> str:
        r = subprocess.run([tool("s3cmd"), "-c", str(cfg), "--no-progress", *args], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout

    b = f"s3cmd2-{uuid.uuid4().hex[:10]}"
    (tmp_path / "f.txt").write_bytes(b"s3cmd v2")
    run("mb", f"s3://{b}")
    run("put", str(tmp_path / "f.txt"), f"s3://{b}/f.txt")
    assert f"s3://{b}/f.txt" in run("ls", f"s3://{b}")
    run("get", f"s3://{b}/f.txt", str(tmp_path / "got"))
    assert (tmp_path / "got").read_bytes() == b"s3cmd v2"
    run("del", f"s3://{b}/f.txt")
    run("rb", f"s3://{b}")


def test_off_refuses_every_form_of_sigv2(tmp_path: Path) -> None:
    """``s3_allow_sigv2 = off``: presigned URLs, the header and POST forms signed with
    SigV2 are 400 InvalidRequest naming the setting; SigV4 still works."""
    d = start_daemon(tmp_path / "data", "--s3-allow-sigv2", "off")
    try:
        s3 = d.client()
        s3.create_bucket(Bucket="off")
        s3.put_object(Bucket="off", Key="k", Body=b"x")
        v2 = v2_client(d.url, signature_version="s3")
        r = requests.get(v2.generate_presigned_url(
            "get_object", Params={"Bucket": "off", "Key": "k"}, ExpiresIn=60), timeout=10)
        assert (r.status_code, error_code(r)) == (400, "InvalidRequest")
        assert "s3_allow_sigv2 = off" in r.text
        r = _raw_v2(d.url, "GET", "/", {"Date": email.utils.formatdate(usegmt=True)})
        assert (r.status_code, error_code(r)) == (400, "InvalidRequest")
        p = v2.generate_presigned_post("off", "posted", ExpiresIn=60)
        r = requests.post(p["url"], data=p["fields"], files={"file": ("f", b"y")}, timeout=10)
        assert (r.status_code, error_code(r)) == (400, "InvalidRequest")
        assert s3.list_objects_v2(Bucket="off")["KeyCount"] == 1
    finally:
        d.stop()


def test_setting_values_and_off() -> None:
    spec = next(s for s in SETTINGS if s.name == "s3_allow_sigv2")
    assert TierdConfig.__dataclass_fields__["s3_allow_sigv2"].default == "presigned"
    assert spec.info.metavar == "|".join(sigv2.MODES)
    with pytest.raises(Exception) as info:
        sigv2.check_allowed("off", None, presigned=True)  # type: ignore[arg-type]
    assert "s3_allow_sigv2 = off" in str(info.value)
