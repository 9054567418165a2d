"""Bucket lifecycle: Put/Get/DeleteBucketLifecycleConfiguration through boto3, the AWS CLI
and raw XML (every validation error), and the daemon's lifecycle job (a daemon of its own
with a short ``lifecycle_interval`` and a one-second day): expiration by days, date, prefix
and size, aborting old uploads, delete markers and noncurrent versions in versioned
buckets, the metrics and log trace, and safety against concurrent writes."""

from __future__ import annotations

import datetime
import json
import os
import re
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from namespace.conftest import NsEnv

from tierd.acl import Identity
from tierd.namespace.lifecycle import (
    Counts,
    Filter,
    LifecycleJob,
    Rule,
    cutoff_ns,
    decode,
    encode,
)

from .conftest import (
    ROOT_KEY,
    ROOT_SECRET,
    Daemon,
    assert_error,
    empty_bucket,
    start_daemon,
)
from .test_auth import send, signed
from .test_clients import aws  # noqa: F401  (the AWS CLI fixture)

DAY = 86400 * 10**9


def put_rules(s3: Any, bucket: str, *rules: dict[str, Any]) -> None:
    s3.put_bucket_lifecycle_configuration(Bucket=bucket,
                                          LifecycleConfiguration={"Rules": list(rules)})


def put_xml(daemon: Daemon, bucket: str, rules: str) -> requests.Response:
    body = f"<LifecycleConfiguration>{rules}</LifecycleConfiguration>".encode()
    return send(signed(daemon, "PUT", f"/{bucket}?lifecycle", body)[0])


def code_of(r: requests.Response) -> str | None:
    return ET.fromstring(r.content).findtext("Code")


# -- the configuration API ---------------------------------------------------------------

def test_get_without_configuration_is_404(s3: Any, bucket: str) -> None:
    assert_error("NoSuchLifecycleConfiguration", 404, s3.get_bucket_lifecycle_configuration,
                 Bucket=bucket)


def test_every_filter_and_action_round_trips(s3: Any, bucket: str) -> None:
    midnight = datetime.datetime(2031, 1, 1, tzinfo=datetime.UTC)
    rules = [
        {"ID": "prefix", "Filter": {"Prefix": "logs/"}, "Status": "Enabled",
         "Expiration": {"Days": 30}},
        {"ID": "tag", "Filter": {"Tag": {"Key": "tmp", "Value": "yes"}}, "Status": "Enabled",
         "Expiration": {"Date": midnight}},
        {"ID": "and", "Filter": {"And": {"Prefix": "a/", "Tags": [{"Key": "k", "Value": "v"}],
                                         "ObjectSizeGreaterThan": 10,
                                         "ObjectSizeLessThan": 1000}},
         "Status": "Disabled", "Expiration": {"Days": 1}},
        {"ID": "gt", "Filter": {"ObjectSizeGreaterThan": 5}, "Status": "Enabled",
         "Expiration": {"Days": 2}},
        {"ID": "lt", "Filter": {"ObjectSizeLessThan": 5}, "Status": "Enabled",
         "Expiration": {"Days": 3}},
        {"ID": "all", "Filter": {}, "Status": "Enabled",
         "NoncurrentVersionExpiration": {"NoncurrentDays": 7, "NewerNoncurrentVersions": 2},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 3}},
        {"ID": "markers", "Filter": {"Prefix": ""}, "Status": "Enabled",
         "Expiration": {"ExpiredObjectDeleteMarker": True}},
        {"ID": "legacy", "Prefix": "old/", "Status": "Enabled", "Expiration": {"Days": 9}},
    ]
    put_rules(s3, bucket, *rules)
    got = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert got == rules


def test_delete_lifecycle(s3: Any, bucket: str) -> None:
    put_rules(s3, bucket, {"ID": "r", "Filter": {}, "Status": "Enabled",
                           "Expiration": {"Days": 1}})
    r = s3.delete_bucket_lifecycle(Bucket=bucket)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert_error("NoSuchLifecycleConfiguration", 404, s3.get_bucket_lifecycle_configuration,
                 Bucket=bucket)
    s3.delete_bucket_lifecycle(Bucket=bucket)  # nothing to delete: still 204


def test_a_rule_without_id_gets_one(s3: Any, bucket: str) -> None:
    put_rules(s3, bucket, {"Filter": {}, "Status": "Enabled", "Expiration": {"Days": 1}})
    rule = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"][0]
    assert rule["ID"] and len(rule["ID"]) <= 255


@pytest.mark.parametrize("action", [
    {"Transitions": [{"Days": 30, "StorageClass": "GLACIER"}]},
    {"NoncurrentVersionTransitions": [{"NoncurrentDays": 30, "StorageClass": "GLACIER"}]},
])
def test_transitions_are_not_implemented(s3: Any, bucket: str, action: dict[str, Any]) -> None:
    resp = assert_error("NotImplemented", 501, put_rules, s3, bucket,
                        {"ID": "t", "Filter": {}, "Status": "Enabled", **action})
    assert "placement" in resp["Error"]["Message"]
    assert_error("NoSuchLifecycleConfiguration", 404, s3.get_bucket_lifecycle_configuration,
                 Bucket=bucket)


_EXP = "<Expiration><Days>1</Days></Expiration>"


@pytest.mark.parametrize("rules,code", [
    (f"<Rule><Filter/>{_EXP}</Rule>", "MalformedXML"),  # no Status
    (f"<Rule><Filter/><Status>On</Status>{_EXP}</Rule>", "MalformedXML"),
    (f"<Rule><Prefix>a</Prefix><Filter/><Status>Enabled</Status>{_EXP}</Rule>",
     "MalformedXML"),
    (f"<Rule><Status>Enabled</Status>{_EXP}</Rule>", "MalformedXML"),  # no filter at all
    ("<Rule><Filter><Prefix>a</Prefix><Tag><Key>k</Key><Value>v</Value></Tag></Filter>"
     f"<Status>Enabled</Status>{_EXP}</Rule>", "MalformedXML"),  # two without <And>
    ("<Rule><Filter/><Status>Enabled</Status><Expiration><Days>1</Days>"
     "<Date>2030-01-01T00:00:00Z</Date></Expiration></Rule>", "MalformedXML"),
    ("<Rule><Filter/><Status>Enabled</Status><Expiration><Days>x</Days></Expiration></Rule>",
     "MalformedXML"),
    ("<Rule><Filter/><Status>Enabled</Status><NoncurrentVersionExpiration/></Rule>",
     "MalformedXML"),
    ("<Rule><Filter/><Status>Enabled</Status><AbortIncompleteMultipartUpload/></Rule>",
     "MalformedXML"),
    (f"<Rule><Filter/><Status>Enabled</Status><Colour>red</Colour>{_EXP}</Rule>",
     "MalformedXML"),
    ("", "MalformedXML"),  # no rule
    (f"<Rule><ID>{'x' * 256}</ID><Filter/><Status>Enabled</Status>{_EXP}</Rule>",
     "InvalidArgument"),
    (f"<Rule><ID>a</ID><Filter/><Status>Enabled</Status>{_EXP}</Rule>" * 2,
     "InvalidArgument"),
    ("<Rule><Filter/><Status>Enabled</Status><Expiration><Days>0</Days></Expiration></Rule>",
     "InvalidArgument"),
    ("<Rule><Filter/><Status>Enabled</Status><Expiration><Date>2030-01-01T10:00:00Z</Date>"
     "</Expiration></Rule>", "InvalidArgument"),
    ("<Rule><Filter><And><ObjectSizeGreaterThan>10</ObjectSizeGreaterThan>"
     "<ObjectSizeLessThan>10</ObjectSizeLessThan></And></Filter><Status>Enabled</Status>"
     f"{_EXP}</Rule>", "InvalidArgument"),
    ("<Rule><Filter><Tag><Key>k</Key><Value>v</Value></Tag></Filter><Status>Enabled</Status>"
     "<AbortIncompleteMultipartUpload><DaysAfterInitiation>1</DaysAfterInitiation>"
     "</AbortIncompleteMultipartUpload></Rule>", "InvalidArgument"),
    ("<Rule><Filter/><Status>Enabled</Status></Rule>", "InvalidRequest"),  # no action
])
def test_invalid_configurations(daemon: Daemon, bucket: str, rules: str, code: str) -> None:
    r = put_xml(daemon, bucket, rules)
    assert r.status_code == (400 if code != "NotImplemented" else 501), r.text
    assert code_of(r) == code, r.text


def test_not_xml_is_malformed(daemon: Daemon, bucket: str) -> None:
    r = send(signed(daemon, "PUT", f"/{bucket}?lifecycle", b"not xml")[0])
    assert r.status_code == 400 and code_of(r) == "MalformedXML"


def test_a_thousand_rules_and_no_more(daemon: Daemon, s3: Any, bucket: str) -> None:
    rule = "<Rule><ID>r{}</ID><Filter><Prefix>p{}/</Prefix></Filter><Status>Enabled</Status>" \
           "<Expiration><Days>30</Days></Expiration></Rule>"
    r = put_xml(daemon, bucket, "".join(rule.format(i, i) for i in range(1000)))
    assert r.status_code == 200, r.text
    assert len(s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]) == 1000
    r = put_xml(daemon, bucket, "".join(rule.format(i, i) for i in range(1001)))
    assert r.status_code == 400 and code_of(r) == "MalformedXML", r.text


def test_only_the_bucket_owner(alice: Any, s3: Any, bucket: str) -> None:
    rule = {"ID": "r", "Filter": {}, "Status": "Enabled", "Expiration": {"Days": 1}}
    assert_error("AccessDenied", 403, put_rules, alice, bucket, rule)
    put_rules(s3, bucket, rule)
    assert_error("AccessDenied", 403, alice.get_bucket_lifecycle_configuration, Bucket=bucket)
    assert_error("AccessDenied", 403, alice.delete_bucket_lifecycle, Bucket=bucket)
    assert s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"] == [rule]


def test_missing_bucket(s3: Any) -> None:
    assert_error("NoSuchBucket", 404, s3.get_bucket_lifecycle_configuration,
                 Bucket=f"gone-{uuid.uuid4().hex[:8]}")


def test_aws_cli_put_and_get(aws: Callable[..., str], bucket: str,  # noqa: F811
                             tmp_path: Path) -> None:
    conf = {"Rules": [{"ID": "cli", "Filter": {"Prefix": "tmp/"}, "Status": "Enabled",
                       "Expiration": {"Days": 7},
                       "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2}}]}
    path = tmp_path / "lc.json"
    path.write_text(json.dumps(conf))
    aws("s3api", "put-bucket-lifecycle-configuration", "--bucket", bucket,
        "--lifecycle-configuration", f"file://{path}")
    got = json.loads(aws("s3api", "get-bucket-lifecycle-configuration", "--bucket", bucket,
                         "--output", "json"))
    assert got["Rules"] == conf["Rules"]
    aws("s3api", "delete-bucket-lifecycle", "--bucket", bucket)


# -- rules, days and the stored form ------------------------------------------------------

def test_days_are_whole_days_to_midnight_utc() -> None:
    """AWS's example: an object created 2014-01-15 10:30 UTC with Days 3 expires at
    2014-01-19 00:00 UTC."""
    made = int(datetime.datetime(2014, 1, 15, 10, 30, tzinfo=datetime.UTC).timestamp() * 1e9)
    due = int(datetime.datetime(2014, 1, 19, tzinfo=datetime.UTC).timestamp() * 1e9)
    assert made <= cutoff_ns(due, 3, 86400)
    assert made > cutoff_ns(due - 1, 3, 86400)


def test_filters_match_prefix_tags_and_sizes() -> None:
    f = Filter("and", "a/", [("k", "v")], gt=10, lt=100)
    assert f.matches("a/x", 50, [("k", "v"), ("o", "p")])
    assert not f.matches("b/x", 50, [("k", "v")])
    assert not f.matches("a/x", 50, [("k", "w")])
    assert not f.matches("a/x", 10, [("k", "v")]) and not f.matches("a/x", 100, [("k", "v")])
    rules = [Rule("r", True, f, days=3, abort_days=1), Rule("s", False, Filter("legacy", "p"),
                                                            noncurrent_days=2)]
    assert decode(encode(rules)) == rules


# -- the lifecycle job -------------------------------------------------------------------

@pytest.fixture(scope="module")
def lcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose lifecycle job runs every 0.2 s with one-second days."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(TIERD_ROOT_ACCESS_KEY=ROOT_KEY, TIERD_ROOT_SECRET_KEY=ROOT_SECRET,
               TIERD_LIFECYCLE_DAY_SECONDS="1")
    d = start_daemon(tmp_path_factory.mktemp("lc") / "data", "--lifecycle-interval", "0.2",
                     env=env)
    yield d
    d.stop()
    assert "Traceback" not in d.log.read_text(errors="replace")


@pytest.fixture
def lcb(lcd: Daemon) -> Iterator[tuple[Any, str]]:
    s3 = lcd.client()
    name = f"lc-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    yield s3, name
    empty_bucket(s3, name)


def wait_for(what: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "the lifecycle job did not act in time"
        time.sleep(0.1)


def keys(s3: Any, bucket: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_expiration_by_days_prefix_and_size(lcd: Daemon, lcb: tuple[Any, str]) -> None:
    s3, b = lcb
    for k, body in (("old/a", b"abc"), ("old/tiny", b"x"), ("keep/b", b"abc")):
        s3.put_object(Bucket=b, Key=k, Body=body)
    put_rules(s3, b,
              {"ID": "off", "Filter": {"Prefix": "keep/"}, "Status": "Disabled",
               "Expiration": {"Days": 1}},
              {"ID": "old", "Filter": {"And": {"Prefix": "old/", "ObjectSizeGreaterThan": 1}},
               "Status": "Enabled", "Expiration": {"Days": 1}})
    wait_for(lambda: "old/a" not in keys(s3, b))
    # the same pass judged the others: too small, or under a disabled rule
    assert keys(s3, b) == ["keep/b", "old/tiny"]
    # the trace: a counter on /metrics and a log line
    doc = json.loads((lcd.data_dir / "endpoints.json").read_text())
    token = (lcd.data_dir / "admin-token").read_text().strip()
    text = requests.get(doc["admin"]["url"] + "/metrics", timeout=10,
                        headers={"Authorization": f"Bearer {token}"}).text
    m = re.search(r'^tierd_lifecycle_actions_total\{action="expire"\} (\S+)$', text, re.M)
    assert m is not None and float(m.group(1)) >= 1, text
    assert "lifecycle: expired" in lcd.log.read_text()


def test_expiration_by_tag(lcb: tuple[Any, str]) -> None:
    s3, b = lcb
    s3.put_object(Bucket=b, Key="t/a", Body=b"x", Tagging="tmp=yes&team=ml")
    s3.put_object(Bucket=b, Key="t/b", Body=b"x", Tagging="tmp=no")
    s3.put_object(Bucket=b, Key="t/c", Body=b"x")
    put_rules(s3, b, {"ID": "tag", "Filter": {"Tag": {"Key": "tmp", "Value": "yes"}},
                      "Status": "Enabled", "Expiration": {"Days": 1}})
    wait_for(lambda: keys(s3, b) == ["t/b", "t/c"])


def test_a_young_object_is_kept(lcb: tuple[Any, str]) -> None:
    """Days 1000 (a thousand one-second days) has not passed: nothing goes, while a second
    rule in the same pass shows the job ran."""
    s3, b = lcb
    s3.put_object(Bucket=b, Key="young", Body=b"x")
    s3.put_object(Bucket=b, Key="gone/x", Body=b"x")
    put_rules(s3, b,
              {"ID": "young", "Filter": {"Prefix": "young"}, "Status": "Enabled",
               "Expiration": {"Days": 1000}},
              {"ID": "gone", "Filter": {"Prefix": "gone/"}, "Status": "Enabled",
               "Expiration": {"Days": 1}})
    wait_for(lambda: keys(s3, b) == ["young"])


def test_expiration_by_date(lcb: tuple[Any, str]) -> None:
    s3, b = lcb
    s3.put_object(Bucket=b, Key="dated/a", Body=b"x")
    s3.put_object(Bucket=b, Key="other", Body=b"x")
    put_rules(s3, b, {"ID": "d", "Filter": {"Prefix": "dated/"}, "Status": "Enabled",
                      "Expiration": {"Date": datetime.datetime(2020, 1, 1,
                                                               tzinfo=datetime.UTC)}})
    wait_for(lambda: keys(s3, b) == ["other"])


def test_abort_incomplete_multipart_uploads(lcb: tuple[Any, str]) -> None:
    s3, b = lcb
    old = s3.create_multipart_upload(Bucket=b, Key="up/a")["UploadId"]
    s3.upload_part(Bucket=b, Key="up/a", UploadId=old, PartNumber=1, Body=b"part")
    other = s3.create_multipart_upload(Bucket=b, Key="else/a")["UploadId"]
    put_rules(s3, b, {"ID": "u", "Filter": {"Prefix": "up/"}, "Status": "Enabled",
                      "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}})

    def uploads() -> list[str]:
        return [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=b).get("Uploads", [])]

    wait_for(lambda: uploads() == [other])
    assert_error("NoSuchUpload", 404, s3.list_parts, Bucket=b, Key="up/a", UploadId=old)


def _versions(s3: Any, b: str) -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]]:
    r = s3.list_object_versions(Bucket=b)
    return ([(v["Key"], v["IsLatest"]) for v in r.get("Versions", [])],
            [(m["Key"], m["IsLatest"]) for m in r.get("DeleteMarkers", [])])


def test_versioned_bucket_expiration_makes_a_delete_marker(lcb: tuple[Any, str]) -> None:
    s3, b = lcb
    s3.put_bucket_versioning(Bucket=b, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=b, Key="v/a", Body=b"one")
    put_rules(s3, b, {"ID": "e", "Filter": {"Prefix": "v/"}, "Status": "Enabled",
                      "Expiration": {"Days": 1}})
    wait_for(lambda: _versions(s3, b)[1] == [("v/a", True)])
    assert _versions(s3, b)[0] == [("v/a", False)]  # the data is kept, noncurrent
    # then noncurrent versions expire, and the marker left alone goes too
    put_rules(s3, b, {"ID": "n", "Filter": {"Prefix": "v/"}, "Status": "Enabled",
                      "NoncurrentVersionExpiration": {"NoncurrentDays": 1}},
              {"ID": "m", "Filter": {"Prefix": "v/"}, "Status": "Enabled",
               "Expiration": {"ExpiredObjectDeleteMarker": True}})
    wait_for(lambda: _versions(s3, b) == ([], []))


def test_newer_noncurrent_versions_are_kept(lcb: tuple[Any, str]) -> None:
    s3, b = lcb
    s3.put_bucket_versioning(Bucket=b, VersioningConfiguration={"Status": "Enabled"})
    for body in (b"1", b"2", b"3", b"4"):
        s3.put_object(Bucket=b, Key="k", Body=body)
    put_rules(s3, b, {"ID": "n", "Filter": {}, "Status": "Enabled",
                      "NoncurrentVersionExpiration": {"NoncurrentDays": 1,
                                                      "NewerNoncurrentVersions": 1}})
    wait_for(lambda: len(_versions(s3, b)[0]) == 2)
    versions = s3.list_object_versions(Bucket=b)["Versions"]
    bodies = [s3.get_object(Bucket=b, Key="k", VersionId=v["VersionId"])["Body"].read()
              for v in versions]
    assert bodies == [b"4", b"3"]  # the current one and the newest noncurrent one


# -- safety against concurrent writes (one namespace, in process) ------------------------

@pytest.fixture
def nsenv(tmp_path: Path) -> Iterator[NsEnv]:
    env = NsEnv(tmp_path)
    yield env
    env.close()


def _seen(env: NsEnv, bucket: str, key: str) -> tuple[int, int, int]:
    inode = env.run(env.ns.head_object(Identity.ROOT, bucket, key))
    return inode.ino, inode.version, inode.mtime_ns


def test_a_key_rewritten_after_the_scan_is_not_deleted(nsenv: NsEnv) -> None:
    nsenv.run(nsenv.ns.create_bucket(Identity.ROOT, "bkt"))
    nsenv.put(Identity.ROOT, "bkt", "k", b"old")
    seen = _seen(nsenv, "bkt", "k")
    nsenv.put(Identity.ROOT, "bkt", "k", b"new")  # written between the scan and the delete
    job = LifecycleJob(nsenv.ns, 1.0)
    done = Counts()
    nsenv.run(job.expire_batch("bkt", [("k", seen)], done))
    assert (done.expired, done.skipped) == (0, 1)
    assert nsenv.get(Identity.ROOT, "bkt", "k") == b"new"
    # judged on what is there now, it goes
    nsenv.run(job.expire_batch("bkt", [("k", _seen(nsenv, "bkt", "k"))], done))
    assert done.expired == 1
    assert nsenv.run(nsenv.ns.list_objects(Identity.ROOT, "bkt")).contents == []


def test_a_file_with_unflushed_writes_is_not_deleted(nsenv: NsEnv) -> None:
    nsenv.run(nsenv.ns.create_bucket(Identity.ROOT, "bkt"))
    nsenv.put(Identity.ROOT, "bkt", "k", b"old")
    ino = nsenv.run(nsenv.ns.head_object(Identity.ROOT, "bkt", "k")).ino
    fh = nsenv.run(nsenv.ns.open(Identity.ROOT, ino, os.O_WRONLY))
    try:
        nsenv.run(nsenv.ns.write(fh, 0, b"NEW"))  # not flushed yet
        seen = _seen(nsenv, "bkt", "k")  # the scan sees the live state
        done = Counts()
        nsenv.run(LifecycleJob(nsenv.ns, 1.0).expire_batch("bkt", [("k", seen)], done))
        assert (done.expired, done.skipped) == (0, 1)
    finally:
        nsenv.run(nsenv.ns.release(fh))
    assert nsenv.get(Identity.ROOT, "bkt", "k") == b"NEW"


def test_run_once_expires_with_a_given_clock(nsenv: NsEnv) -> None:
    """The pass itself, with real days: an object expires at the first midnight UTC at
    least ``Days`` after it was written, not before."""
    ns = nsenv.ns
    nsenv.run(ns.create_bucket(Identity.ROOT, "bkt"))
    nsenv.put(Identity.ROOT, "bkt", "logs/a", b"x")
    nsenv.run(ns.bucket_config.put("bkt", "lifecycle", encode(
        [Rule("r", True, Filter("prefix", "logs/"), days=2)])))
    mtime = nsenv.run(ns.head_object(Identity.ROOT, "bkt", "logs/a")).mtime_ns
    due = (mtime // DAY + 3) * DAY  # midnight after mtime + 2 days
    job = LifecycleJob(ns, 1.0)
    assert nsenv.run(job.run_once(due - 1)).expired == 0
    assert nsenv.run(job.run_once(due)).expired == 1
    assert job.totals.expired == 1 and job.passes == 2
