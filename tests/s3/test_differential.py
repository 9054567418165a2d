"""Differential test: random sequences of S3 calls against tierd and against a moto server
(standalone, over HTTP), both through boto3, comparing every result: statuses and error
codes, bytes, ETags, content ranges, metadata, listings (v1 and v2; prefix, delimiter,
start-after, every page of a paginated listing) and DeleteObjects reports.

Keys come from a small set of names chosen to meet at the edges that matter: ``a-b`` sorts
before ``a/`` and ``a0`` after it (S3 orders keys by bytes, tierd walks directories), ``é``
is multi-byte UTF-8.  The set also makes ``a`` and ``a/…`` collide, which tierd refuses by
design (keys are paths: docs/semantics.md).  A model of the key set predicts those
conflicts: the call then goes to tierd alone, which must answer the documented 409 error
(``XTierdParentIsObject`` / ``XTierdObjectExistsAsDirectory``) and change nothing, and moto
is not asked, so both stores keep the same contents.

Where moto differs from AWS the comparison works around it, each time with a comment:
ListObjects v1 paging (:func:`_v1_pages`), DeleteObjects in quiet mode, and a start-after
inside a common prefix's keys (:func:`_inside_group`).  Nothing else is normalised.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto_server import MotoServer, running_moto

from .conftest import Daemon, empty_bucket

DIRS = ["a", "a-b", "é"]
#: leaf names; ``a`` is also a directory name, so ``a`` vs ``a/…`` conflicts happen
LEAVES = ["a0", "a-", "b", "é", "a"]
KEYS = [*LEAVES, *(f"{d}/{leaf}" for d in DIRS for leaf in LEAVES),
        *(f"{d1}/{d2}/{leaf}" for d1 in ("a", "é") for d2 in ("a-b", "a")
          for leaf in ("a0", "b"))]
PREFIXES = ["", "a", "a/", "a-", "a/a", "é", "é/", "a/a-b/", "zz"]
SIZES = [0, 1, 100, 5000, 70_000]
#: operation kinds, weighted: enough writes that listings have pages to page through
KINDS = ["put"] * 5 + ["get"] * 2 + ["head", "delete", "delete_many", "copy"] + ["list"] * 3
Op = tuple[Any, ...]

range_st = st.one_of(
    st.none(),
    st.tuples(st.integers(0, 6000), st.integers(0, 6000)).map(
        lambda t: f"bytes={min(t)}-{max(t)}"),
    st.integers(0, 80_000).map(lambda n: f"bytes={n}-"),
    st.integers(1, 80_000).map(lambda n: f"bytes=-{n}"),
)


def key_st(existing: set[str]) -> st.SearchStrategy[str]:
    """Mostly keys that exist (when there are any), sometimes any key."""
    if not existing:
        return st.sampled_from(KEYS)
    return st.one_of(st.sampled_from(sorted(existing)), st.sampled_from(KEYS))


def op_st(existing: set[str]) -> st.SearchStrategy[Op]:
    k = key_st(existing)
    return st.sampled_from(KINDS).flatmap(lambda kind: {
        "put": st.tuples(st.just("put"), st.sampled_from(KEYS), st.sampled_from(SIZES),
                         st.integers(0, 3), st.sampled_from([None, "text/plain"]),
                         st.booleans()),
        "get": st.tuples(st.just("get"), k, range_st, st.booleans()),
        "head": st.tuples(st.just("head"), k, st.booleans()),
        "delete": st.tuples(st.just("delete"), k),
        "delete_many": st.tuples(st.just("delete_many"), st.lists(k, min_size=1, max_size=4),
                                 st.booleans()),
        "copy": st.tuples(st.just("copy"), k, st.sampled_from(KEYS), st.booleans()),
        "list": st.tuples(st.just("list"), st.sampled_from([1, 2]), st.sampled_from(PREFIXES),
                          st.sampled_from(["", "/", "/", "-"]),
                          st.sampled_from([1, 2, 3, 1000]),
                          st.one_of(st.just(""), st.sampled_from(KEYS))),
    }[kind])


def body_of(key: str, size: int, seed: int) -> bytes:
    block = hashlib.sha256(f"{key}:{seed}".encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def outcome(fn: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
    """A call's result, or its error as ``{"error": (status, code)}``."""
    try:
        r: dict[str, Any] = fn(**kwargs)
    except ClientError as e:
        meta = e.response.get("ResponseMetadata", {})
        return {"error": (meta.get("HTTPStatusCode"), e.response["Error"]["Code"])}
    return r


def conflict(keys: set[str], key: str) -> str | None:
    """The error tierd must answer for a PUT of ``key`` next to ``keys`` (paths rule)."""
    if any(key.startswith(k + "/") for k in keys):
        return "XTierdParentIsObject"
    if any(k.startswith(key + "/") for k in keys):
        return "XTierdObjectExistsAsDirectory"
    return None


def _object(r: dict[str, Any], body: bool) -> dict[str, Any]:
    if "error" in r:
        return r
    out = {k: r.get(k) for k in ("ETag", "ContentLength", "ContentRange", "ContentType",
                                 "Metadata")}
    if body:
        out["Body"] = r["Body"].read()
    return out


def _contents(page: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(o["Key"], o["ETag"], o["Size"]) for o in page.get("Contents", [])]


def _prefixes(page: dict[str, Any]) -> list[str]:
    return [p["Prefix"] for p in page.get("CommonPrefixes", [])]


def _v2_pages(c: Any, bucket: str, prefix: str, delim: str, max_keys: int,
              start: str) -> list[Any]:
    pages: list[Any] = []
    kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": delim,
                          "MaxKeys": max_keys, "StartAfter": start}
    for _ in range(60):
        r = outcome(c.list_objects_v2, **kw)
        if "error" in r:
            return [*pages, r]
        pages.append((_contents(r), _prefixes(r), r["KeyCount"], r["IsTruncated"]))
        if not r["IsTruncated"]:
            return pages
        kw["ContinuationToken"] = r["NextContinuationToken"]
    raise AssertionError("a listing did not end within 60 pages")


def _v1_pages(c: Any, bucket: str, prefix: str, delim: str, max_keys: int,
              start: str) -> tuple[list[Any], list[Any]]:
    """(everything listed, sorted, each entry once; the pages).  moto's ListObjects v1
    differs from AWS, so v1 listings are compared as the set of what all pages listed
    (tierd's pages are checked against AWS's rules in :func:`_check_v1_pages`): moto
    counts only keys against max-keys and lists common prefixes on top of them, out of key
    order across pages; its NextMarker is an opaque token where AWS returns the last key or
    common prefix of the page; its common prefixes ignore the marker."""
    pages: list[Any] = []
    items: set[Any] = set()
    kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": delim,
                          "MaxKeys": max_keys, "Marker": start}
    for _ in range(60):
        r = outcome(c.list_objects, **kw)
        if "error" in r:
            return [*sorted(items), r], pages
        page = [(k, "key", e, s) for k, e, s in _contents(r)] + [
            (p, "prefix", "", 0) for p in _prefixes(r)]
        pages.append((page, r["IsTruncated"], r.get("NextMarker")))
        items.update(page)
        if not r["IsTruncated"]:
            return sorted(items), pages
        kw["Marker"] = r.get("NextMarker") or max(page)[0]
    raise AssertionError("a listing did not end within 60 pages")


def _inside_group(prefix: str, delim: str, start: str) -> bool:
    """Is ``start`` inside the keys one common prefix stands for (and not that prefix)?"""
    if not delim or not start.startswith(prefix):
        return False
    i = start.find(delim, len(prefix))
    return i >= 0 and start != start[: i + len(delim)]


def _check_v1_pages(pages: list[Any], max_keys: int, marker: str) -> None:
    """AWS's rules for ListObjects v1 pages: at most max-keys entries (keys and common
    prefixes together), all after the marker; a truncated page's NextMarker is its last
    entry."""
    last = marker
    for page, truncated, next_marker in pages:
        assert len(page) <= max_keys, page
        keys = [e[0] for e in page if e[1] == "key"]
        assert keys == sorted(keys), page
        names = sorted(entry[0] for entry in page)
        assert all(name > last for name in names), (last, page)  # after everything before
        last = names[-1] if names else last
        if truncated:
            assert next_marker == names[-1], (page, next_marker)


class Differential:
    """One bucket of the same name in tierd and in moto, and the model of its keys."""

    def __init__(self, tierd: Any, moto: Any, stats: Counter[str]) -> None:
        self.tierd, self.moto, self.stats = tierd, moto, stats
        self.bucket = f"diff-{uuid.uuid4().hex[:16]}"
        self.keys: set[str] = set()
        self.log: list[str] = []
        for c in (tierd, moto):
            c.create_bucket(Bucket=self.bucket)

    def close(self) -> None:
        empty_bucket(self.tierd, self.bucket)
        empty_bucket(self.moto, self.bucket)

    def both(self, name: str, shape: Callable[[dict[str, Any]], Any] = lambda r: r,
             **kwargs: Any) -> Any:
        raw = outcome(getattr(self.moto, name), Bucket=self.bucket, **kwargs)
        self.stats[f"{name} {raw['error'][1] if 'error' in raw else 'ok'}"] += 1
        a = shape(outcome(getattr(self.tierd, name), Bucket=self.bucket, **kwargs))
        b = shape(raw)
        assert a == b, self._explain(f"{name} {kwargs}", a, b)
        return a

    def _explain(self, what: str, tierd: Any, moto: Any) -> str:
        history = "\n  ".join(self.log[-30:])
        return f"{what}\n tierd: {tierd!r}\n moto:  {moto!r}\n after:\n  {history}"

    def conflicting(self, key: str, send: Callable[[], dict[str, Any]]) -> bool:
        """Send a write that tierd must refuse (keys are paths); True if it was one."""
        code = conflict(self.keys, key)
        if code is None:
            return False
        r = send()
        assert r.get("error") == (409, code), self._explain(f"write {key!r}", r, code)
        self.stats[f"conflict {code}"] += 1
        return True

    def run(self, op: Op) -> None:
        self.log.append(repr(op))
        kind, args = op[0], op[1:]
        getattr(self, "op_" + kind)(*args)

    def op_put(self, key: str, size: int, seed: int, ctype: str | None, meta: bool) -> None:
        kw: dict[str, Any] = {"Key": key, "Body": body_of(key, size, seed)}
        if ctype:
            kw["ContentType"] = ctype
        if meta:
            kw["Metadata"] = {"seed": str(seed), "name": "x y"}
        if self.conflicting(key, lambda: outcome(self.tierd.put_object, Bucket=self.bucket,
                                                 **kw)):
            return
        self.both("put_object", lambda r: r.get("error") or r["ETag"], **kw)
        self.keys.add(key)

    def op_get(self, key: str, rng: str | None, conditional: bool) -> None:
        kw: dict[str, Any] = {"Key": key}
        if rng:
            kw["Range"] = rng
        if conditional and key in self.keys:
            kw["IfNoneMatch"] = self.tierd.head_object(Bucket=self.bucket, Key=key)["ETag"]
        self.both("get_object", lambda r: _object(r, body=True), **kw)

    def op_head(self, key: str, conditional: bool) -> None:
        kw: dict[str, Any] = {"Key": key}
        if conditional:
            kw["IfMatch"] = '"0123456789abcdef0123456789abcdef"'
        self.both("head_object", lambda r: _object(r, body=False), **kw)

    def op_delete(self, key: str) -> None:
        self.both("delete_object", lambda r: r.get("error") or
                  r["ResponseMetadata"]["HTTPStatusCode"], Key=key)
        self.keys.discard(key)

    def op_delete_many(self, keys: list[str], quiet: bool) -> None:
        def shape(r: dict[str, Any]) -> Any:
            # moto lists deleted keys even in quiet mode; AWS (and tierd) only errors
            deleted = [] if quiet else sorted(d["Key"] for d in r.get("Deleted", []))
            return r.get("error") or (deleted, r.get("Errors", []))
        objs = [{"Key": k} for k in keys]
        self.both("delete_objects", shape, Delete={"Objects": objs, "Quiet": quiet})
        self.keys.difference_update(keys)

    def op_copy(self, src: str, dst: str, replace: bool) -> None:
        kw: dict[str, Any] = {"Key": dst, "CopySource": {"Bucket": self.bucket, "Key": src}}
        if replace:
            kw.update(MetadataDirective="REPLACE", ContentType="application/x-copied")
        if src in self.keys and (src != dst or replace) and self.conflicting(
                dst, lambda: outcome(self.tierd.copy_object, Bucket=self.bucket, **kw)):
            return
        r = self.both("copy_object", lambda r: r.get("error") or
                      r["CopyObjectResult"]["ETag"], **kw)
        if not isinstance(r, tuple):
            self.keys.add(dst)

    def op_list(self, version: int, prefix: str, delim: str, max_keys: int,
                start: str) -> None:
        if _inside_group(prefix, delim, start):
            # start-after strictly inside a common prefix's keys: moto answers that common
            # prefix even when no key after start-after rolls into it, and tierd never does
            # (AWS lists the keys after start-after, then groups them); not compared
            start = ""
        args = (self.bucket, prefix, delim, max_keys, start)
        name = f"list v{version} prefix={prefix!r} delimiter={delim!r} max={max_keys} " \
               f"start={start!r}"
        if version == 2:
            a, b = _v2_pages(self.tierd, *args), _v2_pages(self.moto, *args)
        else:
            (a, pages), (b, _) = _v1_pages(self.tierd, *args), _v1_pages(self.moto, *args)
            _check_v1_pages(pages, max_keys, start)
            # moto's v1 common prefixes ignore the marker (it answers a-b/ for marker a0)
            b = [x for x in b if not (isinstance(x, tuple) and x[1] == "prefix"
                                      and x[0] <= start)]
        self.stats[f"list v{version}" + (" paged" if len(a) > 1 else "")] += 1
        assert a == b, self._explain(name, a, b)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with running_moto() as server:
        yield server


#: sequences per run (~0.5 s each); S3_DIFF_EXAMPLES=500 for a longer hunt
EXAMPLES = int(os.environ.get("S3_DIFF_EXAMPLES", "50"))
#: outcomes the generator must reach, so a drifting generator fails loudly instead of
#: quietly testing less
EXPECTED = {"put_object ok", "get_object ok", "get_object NoSuchKey", "get_object InvalidRange",
            "get_object 304", "head_object ok", "head_object 404", "head_object 412",
            "delete_object ok", "delete_objects ok", "copy_object ok", "copy_object NoSuchKey",
            "list v1 paged", "list v2 paged", "conflict XTierdParentIsObject",
            "conflict XTierdObjectExistsAsDirectory"}


# passing takes ~25 s; a failure is shrunk for up to hypothesis's 5 minutes, and the
# shrunk sequence is the useful report, so the timeout leaves room for it
@pytest.mark.timeout(720)
def test_tierd_matches_moto(daemon: Daemon, moto: MotoServer) -> None:
    tierd = daemon.client()
    ref = moto.client(retries={"max_attempts": 1})
    stats: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data: st.DataObject) -> None:
        d = Differential(tierd, ref, stats)
        n = data.draw(st.integers(10, 60), label="length")
        stats["examples"] += 1
        stats["operations"] += n
        try:
            for i in range(n):
                d.run(data.draw(op_st(d.keys), label=f"op {i}"))
            d.run(("list", 2, "", "", 1000, ""))  # whatever happened, the same contents
        finally:
            d.close()

    check()
    assert stats.keys() >= EXPECTED, (sorted(EXPECTED - stats.keys()), dict(stats))
