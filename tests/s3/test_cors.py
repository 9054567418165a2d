"""CORS (tierd/s3/cors.py): Put/Get/DeleteBucketCors through boto3 and the AWS CLI, their
validation, the unauthenticated ``OPTIONS`` preflight (also on a presigned URL), and the
``Access-Control-*`` headers on the requests a rule matches, errors included."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import requests

from s3.conftest import Daemon, assert_error
from s3.test_auth import send, signed
from s3.test_clients import aws  # noqa: F401  (the fixture)

ORIGIN = "https://app.example.com"
RULES = {"CORSRules": [
    {"ID": "uploads", "AllowedMethods": ["PUT", "POST"], "AllowedOrigins": [ORIGIN],
     "AllowedHeaders": ["content-type", "x-amz-*"], "ExposeHeaders": ["ETag"],
     "MaxAgeSeconds": 600},
    {"AllowedMethods": ["GET", "HEAD"], "AllowedOrigins": ["https://*.example.org", "*"],
     "ExposeHeaders": ["ETag", "x-amz-request-id"]},
]}


def preflight(daemon: Daemon, path: str, method: str = "PUT", origin: str | None = ORIGIN,
              headers: str | None = None) -> requests.Response:
    h = {}
    if origin is not None:
        h["Origin"] = origin
    if method:
        h["Access-Control-Request-Method"] = method
    if headers is not None:
        h["Access-Control-Request-Headers"] = headers
    return requests.options(daemon.url + path, headers=h, timeout=10)


def code(r: requests.Response) -> str:
    return r.text.split("<Code>")[1].split("</Code>")[0]


def test_put_get_delete_round_trip(s3: Any, bucket: str) -> None:
    assert_error("NoSuchCORSConfiguration", 404, s3.get_bucket_cors, Bucket=bucket)
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=RULES)
    got = s3.get_bucket_cors(Bucket=bucket)["CORSRules"]
    assert got == RULES["CORSRules"]
    s3.delete_bucket_cors(Bucket=bucket)
    assert_error("NoSuchCORSConfiguration", 404, s3.get_bucket_cors, Bucket=bucket)
    s3.delete_bucket_cors(Bucket=bucket)  # deleting nothing is fine, as AWS


def test_aws_cli_put_and_get(aws: Callable[..., str], bucket: str) -> None:  # noqa: F811
    cfg = {"CORSRules": [{"AllowedMethods": ["GET"], "AllowedOrigins": ["*"]}]}
    aws("s3api", "put-bucket-cors", "--bucket", bucket, "--cors-configuration",
        json.dumps(cfg))
    out = json.loads(aws("s3api", "get-bucket-cors", "--bucket", bucket))
    assert out["CORSRules"] == cfg["CORSRules"]


def _rule(**kw: Any) -> dict[str, Any]:
    return {"CORSRules": [{"AllowedMethods": ["GET"], "AllowedOrigins": ["*"], **kw}]}


def test_validation(s3: Any, bucket: str) -> None:
    e = assert_error("InvalidRequest", 400, s3.put_bucket_cors, Bucket=bucket,
                     CORSConfiguration=_rule(AllowedMethods=["PATCH"]))
    assert "Unsupported method is PATCH" in e["Error"]["Message"]
    e = assert_error("InvalidRequest", 400, s3.put_bucket_cors, Bucket=bucket,
                     CORSConfiguration=_rule(AllowedOrigins=["https://*.*.example.com"]))
    assert "can not have more than one wildcard" in e["Error"]["Message"]
    assert_error("InvalidRequest", 400, s3.put_bucket_cors, Bucket=bucket,
                 CORSConfiguration=_rule(AllowedHeaders=["x-*-*"]))
    assert_error("InvalidRequest", 400, s3.put_bucket_cors, Bucket=bucket,
                 CORSConfiguration=_rule(ExposeHeaders=["*"]))
    many = {"CORSRules": _rule()["CORSRules"] * 101}
    e = assert_error("MalformedXML", 400, s3.put_bucket_cors, Bucket=bucket,
                     CORSConfiguration=many)
    assert "at most 100" in e["Error"]["Message"]
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": many["CORSRules"][:100]})
    assert len(s3.get_bucket_cors(Bucket=bucket)["CORSRules"]) == 100


def test_malformed_documents(daemon: Daemon, s3: Any, bucket: str) -> None:
    for body in (b"<CORSConfiguration></CORSConfiguration>",
                 b"<CORSConfiguration><CORSRule><AllowedMethod>GET</AllowedMethod>"
                 b"</CORSRule></CORSConfiguration>",
                 b"<CORSConfiguration><CORSRule><AllowedMethod>GET</AllowedMethod><AllowedOrigin>"
                 b"*</AllowedOrigin><MaxAgeSeconds>x</MaxAgeSeconds></CORSRule>"
                 b"</CORSConfiguration>",
                 b"<CORSConfiguration><CORSRule>"):
        r = send(signed(daemon, "PUT", f"/{bucket}?cors", body)[0])
        assert (r.status_code, code(r)) == (400, "MalformedXML"), body
    assert_error("NoSuchCORSConfiguration", 404, s3.get_bucket_cors, Bucket=bucket)


def test_only_the_owner_configures(s3: Any, alice: Any, daemon: Daemon, bucket: str) -> None:
    assert_error("AccessDenied", 403, alice.put_bucket_cors, Bucket=bucket,
                 CORSConfiguration=_rule())
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=_rule())
    assert_error("AccessDenied", 403, alice.get_bucket_cors, Bucket=bucket)
    assert_error("AccessDenied", 403, alice.delete_bucket_cors, Bucket=bucket)
    r = requests.get(f"{daemon.url}/{bucket}?cors", timeout=10)  # anonymous
    assert r.status_code == 403
    assert s3.get_bucket_cors(Bucket=bucket)["CORSRules"]


def test_preflight_allowed(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=RULES)
    r = preflight(daemon, f"/{bucket}/some/key", "PUT",
                  headers="Content-Type, X-Amz-Meta-Owner")
    assert r.status_code == 200, r.text
    h = r.headers
    assert h["Access-Control-Allow-Origin"] == ORIGIN
    assert h["Access-Control-Allow-Methods"] == "PUT, POST"
    assert h["Access-Control-Allow-Headers"] == "content-type, x-amz-meta-owner"
    assert h["Access-Control-Max-Age"] == "600"
    assert h["Access-Control-Expose-Headers"] == "ETag"
    assert h["Access-Control-Allow-Credentials"] == "true"
    assert "Origin" in h["Vary"]
    # the any-origin rule answers "*" and no credentials; the wildcard subdomain echoes
    r = preflight(daemon, f"/{bucket}", "GET", origin="http://elsewhere.net")
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in r.headers
    r = preflight(daemon, f"/{bucket}", "HEAD", origin="https://cdn.example.org")
    assert r.headers["Access-Control-Allow-Origin"] == "https://cdn.example.org"


def test_preflight_refused(daemon: Daemon, s3: Any, bucket: str) -> None:
    r = preflight(daemon, f"/{bucket}/k")  # no configuration
    assert (r.status_code, code(r)) == (403, "AccessForbidden")
    assert "CORSResponse: This CORS request is not allowed" in r.text
    assert "Access-Control-Allow-Origin" not in r.headers
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=RULES)
    for kw in ({"origin": "https://evil.example.com"},  # PUT only from ORIGIN
               {"method": "DELETE"},
               {"headers": "Content-Type, X-Custom"}):  # a header no rule allows
        r = preflight(daemon, f"/{bucket}/k", **kw)
        assert (r.status_code, code(r)) == (403, "AccessForbidden"), kw
        assert "<ResourceType>OBJECT</ResourceType>" in r.text
    r = preflight(daemon, "/no-such-bucket-cors/k")
    assert (r.status_code, code(r)) == (403, "AccessForbidden")


def test_preflight_needs_origin_and_method(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=RULES)
    r = preflight(daemon, f"/{bucket}/k", origin=None)
    assert r.status_code == 400 and "Origin request header needed" in r.text
    r = preflight(daemon, f"/{bucket}/k", method="")
    assert r.status_code == 400 and "Access-Control-Request-Method" in r.text
    r = preflight(daemon, f"/{bucket}/k", method="PATCH")
    assert r.status_code == 400


def test_preflight_does_not_tell_what_exists(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=RULES)
    s3.put_object(Bucket=bucket, Key="exists", Body=b"x")
    a = preflight(daemon, f"/{bucket}/exists")
    b = preflight(daemon, f"/{bucket}/missing")
    assert a.status_code == b.status_code == 200
    drop = {"x-amz-request-id", "x-amz-id-2", "Date"}
    assert ({k: v for k, v in a.headers.items() if k not in drop}
            == {k: v for k, v in b.headers.items() if k not in drop})


def test_browser_preflight_then_presigned_put(daemon: Daemon, s3: Any, bucket: str) -> None:
    """What a browser does with a presigned URL: OPTIONS on the very URL (the query holds
    a signature for PUT), then the PUT with Origin; the script can read the ETag."""
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=RULES)
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "up"},
                                    ExpiresIn=60)
    r = requests.options(url, timeout=10, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "content-type"})
    assert r.status_code == 200, r.text
    assert r.headers["Access-Control-Allow-Origin"] == ORIGIN
    r = requests.put(url, data=b"from a browser", timeout=10, headers={"Origin": ORIGIN})
    assert r.status_code == 200, r.text
    assert r.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert r.headers["Access-Control-Expose-Headers"] == "ETag"
    assert s3.get_object(Bucket=bucket, Key="up")["Body"].read() == b"from a browser"


def test_headers_on_actual_requests_and_errors(daemon: Daemon, s3: Any, bucket: str) -> None:
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=RULES)
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
    r = requests.get(url, headers={"Origin": "https://a.example.org"}, timeout=10)
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "https://a.example.org"
    assert r.headers["Access-Control-Expose-Headers"] == "ETag, x-amz-request-id"
    # errors carry them too: a 404, and an unsigned request's 403
    missing = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "no"})
    r = requests.get(missing, headers={"Origin": "https://a.example.org"}, timeout=10)
    assert r.status_code == 404 and r.headers["Access-Control-Allow-Origin"]
    r = requests.get(f"{daemon.url}/{bucket}/k", headers={"Origin": ORIGIN}, timeout=10)
    assert r.status_code == 403 and r.headers["Access-Control-Allow-Origin"] == "*"
    # no Origin, or a method no rule allows for it: no CORS headers
    r = requests.get(url, timeout=10)
    assert "Access-Control-Allow-Origin" not in r.headers
    r = requests.delete(f"{daemon.url}/{bucket}/k", headers={"Origin": ORIGIN}, timeout=10)
    assert "Access-Control-Allow-Origin" not in r.headers
