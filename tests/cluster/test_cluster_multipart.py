"""Multipart uploads across the nodes of a cluster, as behind a load balancer: any node takes
any part (on its own hot tier) and completes any upload, fetching the parts other nodes hold
through their peer doors (tierd/namespace/mpu_remote.py).  Every node lists the upload and
its parts; a completion or an abort through any node leaves no part file on any node, also
on a node that was down meanwhile; a node holding a part that is down makes Complete fail
with a 5xx naming it, and the upload completes once it is back."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .clusterlib import Cluster, Node, poll
from .conftest import KEEPALIVE

pytestmark = pytest.mark.usefixtures("bucket")
BUCKET = "mpux"
PART = 5 << 20


def _dir(node: Node, upload: str) -> Path:
    """The upload's directory on ``node``'s hot tier."""
    return node.data_dir / "hot" / "mpu" / upload


def _clients(cluster: Cluster) -> dict[int, Any]:
    return {i: cluster[i].s3() for i in (1, 2, 3)}


def _put(s3: Any, key: str, up: str, number: int, data: bytes) -> dict[str, Any]:
    etag = s3.upload_part(Bucket=BUCKET, Key=key, UploadId=up, PartNumber=number,
                          Body=data)["ETag"]
    assert etag.strip('"') == hashlib.md5(data).hexdigest()
    return {"PartNumber": number, "ETag": etag}


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _mpu_etag(parts: list[bytes]) -> str:
    md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    return f'"{hashlib.md5(md5s).hexdigest()}-{len(parts)}"'


def _gone(cluster: Cluster, up: str, *nodes: int) -> bool:
    return not any(_dir(cluster[i], up).exists() for i in nodes)


def test_parts_spread_over_three_nodes_complete_on_n2_and_read_on_all(
        cluster: Cluster) -> None:
    s = _clients(cluster)
    up = s[1].create_multipart_upload(Bucket=BUCKET, Key="spread")["UploadId"]
    data = [os.urandom(PART), os.urandom(PART), os.urandom(PART + 4096), os.urandom(1000)]
    via = [1, 2, 3, 2]  # part n through node via[n-1]
    listed = [_put(s[via[i]], "spread", up, i + 1, d) for i, d in enumerate(data)]
    for i in (1, 2, 3):  # parts and upload listed on every node, with their sizes
        got = s[i].list_parts(Bucket=BUCKET, Key="spread", UploadId=up)["Parts"]
        assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in got] == [
            (n["PartNumber"], n["ETag"], len(d)) for n, d in zip(listed, data, strict=True)]
        ups = s[i].list_multipart_uploads(Bucket=BUCKET)["Uploads"]
        assert up in [u["UploadId"] for u in ups]
    for i in (1, 2, 3):  # each part went to the hot tier of the node that took it
        assert _dir(cluster[i], up).is_dir(), f"n{i} holds no part"
    done = s[2].complete_multipart_upload(Bucket=BUCKET, Key="spread", UploadId=up,
                                          MultipartUpload={"Parts": listed})
    assert done["ETag"] == _mpu_etag(data)
    want = _sha(b"".join(data))
    for i in (1, 2, 3):
        got_obj = s[i].get_object(Bucket=BUCKET, Key="spread")
        assert got_obj["ETag"] == done["ETag"]
        assert _sha(got_obj["Body"].read()) == want, f"n{i} reads other bytes"
    poll(lambda: _gone(cluster, up, 1, 2, 3), 15)  # no part file left on any node
    for i in (1, 2, 3):
        with pytest.raises(ClientError) as e:
            s[i].list_parts(Bucket=BUCKET, Key="spread", UploadId=up)
        assert e.value.response["Error"]["Code"] == "NoSuchUpload"


def test_an_abort_on_n3_reclaims_the_parts_on_n1_and_n2(cluster: Cluster) -> None:
    s = _clients(cluster)
    up = s[1].create_multipart_upload(Bucket=BUCKET, Key="dropped")["UploadId"]
    _put(s[1], "dropped", up, 1, os.urandom(PART))
    _put(s[2], "dropped", up, 2, os.urandom(1000))
    assert os.listdir(_dir(cluster[1], up)) and os.listdir(_dir(cluster[2], up))
    s[3].abort_multipart_upload(Bucket=BUCKET, Key="dropped", UploadId=up)
    poll(lambda: _gone(cluster, up, 1, 2, 3), 15)
    for i in (1, 2, 3):
        with pytest.raises(ClientError) as e:
            s[i].list_parts(Bucket=BUCKET, Key="dropped", UploadId=up)
        assert e.value.response["Error"]["Code"] == "NoSuchUpload"
        ups = s[i].list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
        assert up not in [u["UploadId"] for u in ups]
        with pytest.raises(ClientError) as e:
            _put(s[i], "dropped", up, 3, b"late")
        assert e.value.response["Error"]["Code"] == "NoSuchUpload"
    assert _gone(cluster, up, 1, 2, 3)  # the refused late parts left nothing either


def test_a_part_copied_again_on_another_node_replaces_it_and_its_file_goes(
        cluster: Cluster) -> None:
    s = _clients(cluster)
    up = s[3].create_multipart_upload(Bucket=BUCKET, Key="again")["UploadId"]
    first = os.urandom(1000)
    _put(s[1], "again", up, 2, first)  # before any slot size: a file of its own on n1
    own = [f for f in os.listdir(_dir(cluster[1], up)) if f.startswith("p2-")]
    assert len(own) == 1
    p1 = _put(s[1], "again", up, 1, os.urandom(PART))
    body1 = s[3].list_parts(Bucket=BUCKET, Key="again", UploadId=up)["Parts"]
    assert [p["ETag"] for p in body1][1] == f'"{hashlib.md5(first).hexdigest()}"'
    second = os.urandom(2000)  # through n2, copied from an object written through n1
    s[1].put_object(Bucket=BUCKET, Key="again-src", Body=b"x" * 100 + second)
    p2 = {"PartNumber": 2, "ETag": s[2].upload_part_copy(
        Bucket=BUCKET, Key="again", UploadId=up, PartNumber=2, CopySourceRange="bytes=100-2099",
        CopySource={"Bucket": BUCKET, "Key": "again-src"})["CopyPartResult"]["ETag"]}
    assert p2["ETag"] == f'"{hashlib.md5(second).hexdigest()}"'
    poll(lambda: not (_dir(cluster[1], up) / own[0]).exists(), 15)  # n1's old part file
    for i in (1, 2, 3):
        parts = s[i].list_parts(Bucket=BUCKET, Key="again", UploadId=up)["Parts"]
        assert [(p["ETag"], p["Size"]) for p in parts] == [(p1["ETag"], PART),
                                                           (p2["ETag"], 2000)]
    s[1].complete_multipart_upload(Bucket=BUCKET, Key="again", UploadId=up,
                                   MultipartUpload={"Parts": [p1, p2]})
    got = s[3].get_object(Bucket=BUCKET, Key="again")["Body"].read()
    assert len(got) == PART + 2000 and got[PART:] == second
    poll(lambda: _gone(cluster, up, 1, 2, 3), 15)


def test_a_dead_holder_fails_complete_clearly_and_it_completes_once_back(
        cluster: Cluster) -> None:
    s = _clients(cluster)
    up = s[2].create_multipart_upload(Bucket=BUCKET, Key="held")["UploadId"]
    data = [os.urandom(PART), os.urandom(PART), os.urandom(3000)]
    listed = [_put(s[i], "held", up, i, d) for i, d in zip((1, 2, 3), data, strict=True)]
    n1 = cluster[1]
    n1.kill9()
    try:
        for i in (2, 3):  # whichever node completes: a 5xx naming n1, no object
            with pytest.raises(ClientError) as e:
                s[i].complete_multipart_upload(Bucket=BUCKET, Key="held", UploadId=up,
                                               MultipartUpload={"Parts": listed})
            err = e.value.response
            assert err["ResponseMetadata"]["HTTPStatusCode"] == 503, err
            assert err["Error"]["Code"] == "ServiceUnavailable", err
            assert "'n1'" in err["Error"]["Message"], err
            with pytest.raises(ClientError) as e:
                s[i].head_object(Bucket=BUCKET, Key="held")
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
            parts = s[i].list_parts(Bucket=BUCKET, Key="held", UploadId=up)["Parts"]
            assert [p["PartNumber"] for p in parts] == [1, 2, 3]
    finally:
        n1.start(60)
    done = s[3].complete_multipart_upload(Bucket=BUCKET, Key="held", UploadId=up,
                                          MultipartUpload={"Parts": listed})
    assert done["ETag"] == _mpu_etag(data)
    want = _sha(b"".join(data))
    s[1] = n1.s3()
    for i in (1, 2, 3):
        assert _sha(s[i].get_object(Bucket=BUCKET, Key="held")["Body"].read()) == want
    poll(lambda: _gone(cluster, up, 1, 2, 3), 15)


def test_two_completes_at_once_on_two_nodes_both_answer_the_object(
        cluster: Cluster) -> None:
    """A client's retry through another node while the first Complete still fetches
    parts (a load balancer's timeout): the one that loses answers like the winner."""
    s = _clients(cluster)
    for rnd in range(2):
        key = f"twice{rnd}"
        up = s[1].create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
        data = [os.urandom(3 * PART) for _ in range(3)]
        listed = [_put(s[i], key, up, i, d) for i, d in zip((1, 2, 3), data, strict=True)]
        with ThreadPoolExecutor(2) as ex:
            answers = [f.result() for f in [
                ex.submit(s[i].complete_multipart_upload, Bucket=BUCKET, Key=key,
                          UploadId=up, MultipartUpload={"Parts": listed}) for i in (2, 3)]]
        assert [a["ETag"] for a in answers] == [_mpu_etag(data)] * 2
        assert _sha(s[1].get_object(Bucket=BUCKET, Key=key)["Body"].read()) == _sha(
            b"".join(data))
        poll(functools.partial(_gone, cluster, up, 1, 2, 3), 15)


def test_a_part_whose_bytes_changed_on_its_node_never_makes_an_object(
        cluster: Cluster) -> None:
    """The bytes a node sends for a part are checked against the part's record (MD5 and
    size) before the object is installed: here they rotted on n1's disk."""
    s = _clients(cluster)
    up = s[2].create_multipart_upload(Bucket=BUCKET, Key="rot")["UploadId"]
    data = [os.urandom(PART), os.urandom(500)]
    listed = [_put(s[1], "rot", up, 1, data[0]), _put(s[2], "rot", up, 2, data[1])]
    [held] = [f for f in os.listdir(_dir(cluster[1], up))]
    with open(_dir(cluster[1], up) / held, "r+b") as f:
        f.seek(4096)
        f.write(b"\0rot\0")
    with pytest.raises(ClientError) as e:
        s[3].complete_multipart_upload(Bucket=BUCKET, Key="rot", UploadId=up,
                                       MultipartUpload={"Parts": listed})
    err = e.value.response
    assert err["ResponseMetadata"]["HTTPStatusCode"] >= 500, err
    assert "'n1'" in err["Error"]["Message"] and "MD5" in err["Error"]["Message"], err
    with pytest.raises(ClientError) as e:
        s[3].head_object(Bucket=BUCKET, Key="rot")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    listed[0] = _put(s[3], "rot", up, 1, data[0])  # the part sent again: it completes
    s[3].complete_multipart_upload(Bucket=BUCKET, Key="rot", UploadId=up,
                                   MultipartUpload={"Parts": listed})
    assert _sha(s[1].get_object(Bucket=BUCKET, Key="rot")["Body"].read()) == _sha(
        b"".join(data))
    poll(lambda: _gone(cluster, up, 1, 2, 3), 15)


def test_a_node_down_during_an_abort_reclaims_its_parts_when_it_restarts(
        cluster: Cluster) -> None:
    s = _clients(cluster)
    up = s[2].create_multipart_upload(Bucket=BUCKET, Key="later")["UploadId"]
    _put(s[1], "later", up, 1, os.urandom(PART))
    _put(s[1], "later", up, 3, os.urandom(100))
    _put(s[2], "later", up, 2, os.urandom(PART))
    n1 = cluster[1]
    n1.kill9()
    try:
        s[3].abort_multipart_upload(Bucket=BUCKET, Key="later", UploadId=up)
        poll(lambda: _gone(cluster, up, 2, 3), 15)
        assert _dir(n1, up).is_dir()  # down: nothing removed its files yet
    finally:
        n1.start(60)
    assert _gone(cluster, up, 1)  # reconciled with the records at start


def test_a_kill_9_of_the_completing_node_leaves_the_upload_completable(
        cluster: Cluster) -> None:
    """n2 dies while it completes (fetching parts from n1 and n3, or just after): once
    back, Complete through n3 answers the object -- made then or now, never half --, and no
    staging file or part file stays anywhere."""
    s = _clients(cluster)
    up = s[2].create_multipart_upload(Bucket=BUCKET, Key="dies")["UploadId"]
    data = [os.urandom(4 * PART) for _ in range(4)]
    listed = [_put(s[i], "dies", up, n, d)
              for n, (i, d) in enumerate(zip((1, 3, 1, 3), data, strict=True), 1)]
    n2 = cluster[2]
    staging = n2.data_dir / "hot" / "tmp"
    c2 = n2.s3(read_timeout=30)
    outcome: list[object] = []

    def complete() -> None:
        try:
            outcome.append(c2.complete_multipart_upload(
                Bucket=BUCKET, Key="dies", UploadId=up, MultipartUpload={"Parts": listed}))
        except Exception as e:  # the connection dies with the node
            outcome.append(e)

    t = threading.Thread(target=complete)
    t.start()
    poll(lambda: any(staging.iterdir()) or outcome, 30, every=0.005)  # assembling ...
    n2.kill9()  # ... and killed
    t.join(60)
    n2.start(60)
    print("n2's own Complete:", type(outcome[0]).__name__ if outcome else "no answer")
    assert not os.listdir(staging), "a staging file outlived the crash"
    done = s[3].complete_multipart_upload(Bucket=BUCKET, Key="dies", UploadId=up,
                                          MultipartUpload={"Parts": listed})
    assert done["ETag"] == _mpu_etag(data), outcome
    want = _sha(b"".join(data))
    for i in (1, 2, 3):
        assert _sha(cluster[i].s3().get_object(Bucket=BUCKET, Key="dies")["Body"].read()) \
            == want
    poll(functools.partial(_gone, cluster, up, 1, 2, 3), 15)


def _complete_in_thread(s3: Any, key: str, up: str, listed: list[dict[str, Any]]
                        ) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(s3.complete_multipart_upload(
                Bucket=BUCKET, Key=key, UploadId=up, MultipartUpload={"Parts": listed}))
        except Exception as e:
            outcome.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, outcome


def test_a_complete_stalled_on_a_node_keeps_its_client_connected(cluster: Cluster) -> None:
    """n1 stops answering (SIGSTOP) while n3 completes an upload with a part on it: n3
    answers 200 after s3_complete_keepalive (KEEPALIVE) and sends spaces, so a client
    whose read timeout is a little longer waits as long as it takes: the result once n1
    answers again, or -- n1 killed meanwhile -- the error, as the answer's body."""
    s = _clients(cluster)
    n1 = cluster[1]
    patient = cluster[3].s3(read_timeout=KEEPALIVE + 4,  # and no retry
                            retries={"total_max_attempts": 1, "mode": "standard"})
    for key, then_kill in (("stalled", False), ("stalled-dead", True)):
        up = s[2].create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
        data = [os.urandom(PART), os.urandom(1000)]
        listed = [_put(s[1], key, up, 1, data[0]), _put(s[2], key, up, 2, data[1])]
        assert n1.proc is not None
        pid = n1.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            t, outcome = _complete_in_thread(patient, key, up, listed)
            time.sleep(KEEPALIVE + 6)  # past the client's read timeout
            if then_kill:
                n1.kill9()
        finally:
            with contextlib.suppress(ProcessLookupError):  # (killed: gone)
                os.kill(pid, signal.SIGCONT)
        t.join(60)
        took = time.monotonic() - t0
        assert took > KEEPALIVE + 4 and outcome, (took, outcome)
        if not then_kill:
            assert isinstance(outcome[0], dict), outcome
            assert outcome[0]["ETag"] == _mpu_etag(data)
            continue
        err = outcome[0]
        assert isinstance(err, ClientError), outcome
        assert err.response["Error"]["Code"] == "ServiceUnavailable", err.response
        assert "'n1'" in err.response["Error"]["Message"], err.response
        n1.start(60)
        done = s[3].complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=up,
                                              MultipartUpload={"Parts": listed})
        assert done["ETag"] == _mpu_etag(data)
    for key in ("stalled", "stalled-dead"):
        assert s[2].head_object(Bucket=BUCKET, Key=key)["ContentLength"] == PART + 1000
