"""docs/s3-compatibility.md agrees with the S3 gateway's router.

The operations the page calls *supported* or *partial* must be exactly the handlers the
router dispatches to (``OPERATIONS`` in tierd/s3/operations.py, the list the router looks
requests up in, whose names are also the ``operation`` metric label), less the ones whose
handler always refuses; and every sub-resource the router answers with 501 must be named on
the page.
"""

from __future__ import annotations

import re
from pathlib import Path

from s3.conftest import start_daemon
from s3.test_auth import send, signed

from tierd.s3.operations import OPERATIONS, UNSUPPORTED

DOC = Path(__file__).resolve().parents[2] / "docs" / "s3-compatibility.md"
STATUSES = {"supported", "partial", "not supported"}
#: routed, but the handler always answers 501 NotImplemented (tests/s3/test_errors.py
#: checks PutBucketVersioning's 501)
ROUTED_BUT_REFUSED: set[str] = set()


def rows() -> dict[str, str]:
    """Operation name → status, from every ``| operation | status | notes |`` table."""
    out: dict[str, str] = {}
    in_table = False
    for line in DOC.read_text().splitlines():
        if line.startswith("| operation | status |"):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if not in_table or line.startswith("| ---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        status = cells[1]
        assert status in STATUSES, f"bad status {status!r} in: {line}"
        for name in cells[0].split(","):
            name = name.strip()
            assert re.fullmatch(r"[A-Z][A-Za-z0-9 ]+", name), f"bad operation name {name!r}"
            assert name not in out, f"{name} is listed twice"
            out[name] = status
    return out


def test_supported_operations_are_exactly_the_routed_handlers() -> None:
    table = rows()
    claimed = {name for name, status in table.items() if status != "not supported"}
    routed = {op.name for op in OPERATIONS} - ROUTED_BUT_REFUSED
    assert claimed - routed == set(), "the page claims operations the router has no handler for"
    assert routed - claimed == set(), "the router handles operations the page does not claim"
    for name in ROUTED_BUT_REFUSED:
        assert table.get(name) == "not supported"


def test_every_not_implemented_sub_resource_is_named() -> None:
    text = DOC.read_text()
    for sub in sorted(UNSUPPORTED):
        assert f"`?{sub}`" in text, f"docs/s3-compatibility.md does not mention ?{sub}"


def test_the_page_covers_the_whole_api() -> None:
    """A sample across the AWS API's families, so a table cannot be silently dropped."""
    table = rows()
    for name in ["PutBucketLifecycleConfiguration", "PutBucketCors", "PutBucketWebsite",
                 "PutBucketReplication", "PutBucketEncryption", "PutObjectLockConfiguration",
                 "SelectObjectContent", "GetObjectTagging", "PutPublicAccessBlock",
                 "ListBucketInventoryConfigurations", "GetBucketNotificationConfiguration",
                 "RestoreObject", "GetObjectAttributes", "PostObject"]:
        assert name in table, name  # listed, whatever its status


def test_not_supported_sub_resources_answer_501_on_a_real_daemon(tmp_path: Path) -> None:
    """Every ``?sub-resource`` a *not supported* row names is refused with 501 by the gateway,
    on the bucket and on an object, and nothing is stored."""
    subs: set[str] = set()
    for line in DOC.read_text().splitlines():
        if line.startswith("| ") and "| not supported |" in line:
            subs.update(re.findall(r"`\?([\w-]+)`", line))
    assert subs >= {"website", "select", "object-lock", "session"}
    d = start_daemon(tmp_path / "data")
    try:
        s3 = d.client()
        s3.create_bucket(Bucket="compat")
        s3.put_object(Bucket="compat", Key="k", Body=b"x")
        for sub in sorted(subs):
            for method, path in (("GET", f"/compat?{sub}"), ("PUT", f"/compat?{sub}"),
                                 ("GET", f"/compat/k?{sub}"), ("DELETE", f"/compat/k?{sub}")):
                r = send(signed(d, method, path)[0])
                assert r.status_code == 501, (method, path, r.text)
                assert "<Code>NotImplemented</Code>" in r.text
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="compat")["Contents"]]
        assert keys == ["k"] and s3.get_object(Bucket="compat", Key="k")["Body"].read() == b"x"
    finally:
        d.stop()
