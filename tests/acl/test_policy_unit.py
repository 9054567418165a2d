"""Bucket policies without a daemon: parsing, validation errors and evaluation
(tierd.acl.policy), plus a hypothesis fuzz of the parser: whatever bytes or JSON arrive, the
result is a Policy or MalformedPolicy, never another exception."""

from __future__ import annotations

import errno
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nsplacement import close_namespace, open_namespace

from tierd.acl import canned
from tierd.acl.authorize import GRANT_MASK
from tierd.acl.identity import ANONYMOUS_ID, Grant, Identity
from tierd.acl.policy import (
    ANONYMOUS,
    MAX_POLICY_BYTES,
    Decision,
    MalformedPolicy,
    Policy,
    Request,
    Requester,
    parse_policy,
)
from tierd.errors import FsError
from tierd.meta import MetaStore

B = "data"
ALICE = Requester("AKALICE", "alice", "c-alice")
BOB = Requester("AKBOB", "bob", "c-bob")


def policy(*statements: dict[str, Any], version: str = "2012-10-17") -> Policy:
    return parse_policy(json.dumps({"Version": version, "Statement": list(statements)}), B)


def stmt(effect: str = "Allow", principal: Any = "*", action: Any = "s3:GetObject",
         resource: Any = f"arn:aws:s3:::{B}/*", **extra: Any) -> dict[str, Any]:
    return {"Effect": effect, "Principal": principal, "Action": action,
            "Resource": resource, **extra}


def decide(p: Policy, who: Requester, action: str, key: str | None = None,
           **context: str) -> Decision:
    return p.evaluate(Request(who, action, B, key, context))[0]


def malformed(doc: Any, match: str) -> None:
    raw = doc if isinstance(doc, (bytes, str)) else json.dumps(doc)
    with pytest.raises(MalformedPolicy, match=match):
        parse_policy(raw, B)


# -- evaluation ---------------------------------------------------------------------------

def test_public_read_of_a_prefix() -> None:
    p = policy(stmt(resource=f"arn:aws:s3:::{B}/public/*"))
    assert decide(p, ANONYMOUS, "s3:GetObject", "public/a/b.txt") is Decision.ALLOW
    assert decide(p, ANONYMOUS, "s3:GetObject", "private/x") is Decision.NONE
    assert decide(p, ANONYMOUS, "s3:GetObject", "publicity") is Decision.NONE
    assert decide(p, ANONYMOUS, "s3:PutObject", "public/x") is Decision.NONE
    assert decide(p, ALICE, "s3:GetObject", "public/x") is Decision.ALLOW
    assert p.public


def test_deny_wins_over_allow_in_any_order() -> None:
    allow = stmt(action="s3:*", resource=[f"arn:aws:s3:::{B}", f"arn:aws:s3:::{B}/*"])
    deny = stmt("Deny", {"AWS": "alice"}, "s3:GetObject")
    for p in (policy(allow, deny), policy(deny, allow)):
        assert decide(p, ALICE, "s3:GetObject", "k") is Decision.DENY
        assert decide(p, ALICE, "s3:PutObject", "k") is Decision.ALLOW
        assert decide(p, BOB, "s3:GetObject", "k") is Decision.ALLOW


@pytest.mark.parametrize("name", ["alice", "AKALICE", "arn:aws:iam::123456789012:user/alice",
                                  "arn:aws:iam::123456789012:user/team/alice"])
def test_principal_forms(name: str) -> None:
    p = policy(stmt(principal={"AWS": [name]}))
    assert decide(p, ALICE, "s3:GetObject", "k") is Decision.ALLOW
    assert decide(p, BOB, "s3:GetObject", "k") is Decision.NONE
    assert decide(p, ANONYMOUS, "s3:GetObject", "k") is Decision.NONE
    assert not p.public


def test_canonical_user_principal_and_aws_star() -> None:
    p = policy(stmt(principal={"CanonicalUser": "c-bob"}))
    assert decide(p, BOB, "s3:GetObject", "k") is Decision.ALLOW
    assert decide(p, ALICE, "s3:GetObject", "k") is Decision.NONE
    p = policy(stmt(principal={"AWS": "*"}))
    assert decide(p, ANONYMOUS, "s3:GetObject", "k") is Decision.ALLOW


def test_action_wildcards_and_case() -> None:
    p = policy(stmt(action="s3:Get*"))
    assert decide(p, ALICE, "s3:GetObject", "k") is Decision.ALLOW
    assert decide(p, ALICE, "s3:GetObjectAcl", "k") is Decision.ALLOW
    assert decide(p, ALICE, "s3:PutObject", "k") is Decision.NONE
    p = policy(stmt(action="S3:getobject"))
    assert decide(p, ALICE, "s3:GetObject", "k") is Decision.ALLOW
    p = policy(stmt(action="s3:?etObject"))
    assert decide(p, ALICE, "s3:GetObject", "k") is Decision.ALLOW


def test_not_action_and_not_resource() -> None:
    p = policy({"Effect": "Deny", "Principal": "*", "NotAction": "s3:GetObject",
                "Resource": f"arn:aws:s3:::{B}/*"})
    assert decide(p, ALICE, "s3:PutObject", "k") is Decision.DENY
    assert decide(p, ALICE, "s3:GetObject", "k") is Decision.NONE
    p = policy({"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                "NotResource": f"arn:aws:s3:::{B}/secret/*"})
    assert decide(p, ALICE, "s3:GetObject", "a") is Decision.ALLOW
    assert decide(p, ALICE, "s3:GetObject", "secret/a") is Decision.NONE


def test_bucket_resource_versus_object_resource() -> None:
    p = policy(stmt(action=["s3:ListBucket", "s3:GetObject"],
                    resource=f"arn:aws:s3:::{B}"))
    assert decide(p, ALICE, "s3:ListBucket") is Decision.ALLOW
    assert decide(p, ALICE, "s3:GetObject", "k") is Decision.NONE
    p = policy(stmt(resource=f"arn:aws:s3:::{B}/a?c"))
    assert decide(p, ALICE, "s3:GetObject", "abc") is Decision.ALLOW
    assert decide(p, ALICE, "s3:GetObject", "abbc") is Decision.NONE


def test_source_ip_conditions() -> None:
    p = policy(stmt(Condition={"IpAddress": {"aws:SourceIp": ["127.0.0.0/8", "::1/128"]}}))
    assert decide(p, ALICE, "s3:GetObject", "k", **{"aws:sourceip": "127.0.0.1"}) \
        is Decision.ALLOW
    assert decide(p, ALICE, "s3:GetObject", "k", **{"aws:sourceip": "::1"}) is Decision.ALLOW
    assert decide(p, ALICE, "s3:GetObject", "k", **{"aws:sourceip": "10.0.0.1"}) \
        is Decision.NONE
    assert decide(p, ALICE, "s3:GetObject", "k") is Decision.NONE  # no address: no match
    p = policy(stmt("Deny", action="s3:*",
                    Condition={"NotIpAddress": {"aws:SourceIp": "10.0.0.0/8"}}))
    assert decide(p, ALICE, "s3:GetObject", "k", **{"aws:sourceip": "127.0.0.1"}) \
        is Decision.DENY
    assert decide(p, ALICE, "s3:GetObject", "k", **{"aws:sourceip": "10.9.9.9"}) \
        is Decision.NONE


def test_string_conditions_on_prefix_and_absent_keys() -> None:
    p = policy(stmt(action="s3:ListBucket", resource=f"arn:aws:s3:::{B}",
                    Condition={"StringLike": {"s3:prefix": ["public/*", ""]}}))
    assert decide(p, ANONYMOUS, "s3:ListBucket", None, **{"s3:prefix": "public/x"}) \
        is Decision.ALLOW
    assert decide(p, ANONYMOUS, "s3:ListBucket", None, **{"s3:prefix": ""}) is Decision.ALLOW
    assert decide(p, ANONYMOUS, "s3:ListBucket", None, **{"s3:prefix": "private/"}) \
        is Decision.NONE
    assert decide(p, ANONYMOUS, "s3:ListBucket") is Decision.NONE
    # negated operators hold when the key is absent (IAM); IfExists makes any operator hold
    p = policy(stmt(Condition={"StringNotEquals": {"s3:x-amz-acl": "public-read"}}))
    assert decide(p, ALICE, "s3:GetObject", "k") is Decision.ALLOW
    assert decide(p, ALICE, "s3:GetObject", "k", **{"s3:x-amz-acl": "public-read"}) \
        is Decision.NONE
    p = policy(stmt(Condition={"StringEqualsIfExists": {"s3:delimiter": "/"}}))
    assert decide(p, ALICE, "s3:GetObject", "k") is Decision.ALLOW
    assert decide(p, ALICE, "s3:GetObject", "k", **{"s3:delimiter": "-"}) is Decision.NONE


def test_bool_numeric_null_and_and_of_conditions() -> None:
    p = policy(stmt("Deny", action="s3:*",
                    Condition={"Bool": {"aws:SecureTransport": False}}))
    assert decide(p, ALICE, "s3:GetObject", "k", **{"aws:securetransport": "false"}) \
        is Decision.DENY
    assert decide(p, ALICE, "s3:GetObject", "k", **{"aws:securetransport": "true"}) \
        is Decision.NONE
    p = policy(stmt(action="s3:ListBucket", resource=f"arn:aws:s3:::{B}",
                    Condition={"NumericLessThanEquals": {"s3:max-keys": 10},
                               "StringEquals": {"s3:delimiter": "/"}}))
    ok = {"s3:max-keys": "5", "s3:delimiter": "/"}
    assert decide(p, ALICE, "s3:ListBucket", None, **ok) is Decision.ALLOW
    assert decide(p, ALICE, "s3:ListBucket", None, **{**ok, "s3:max-keys": "11"}) \
        is Decision.NONE
    assert decide(p, ALICE, "s3:ListBucket", None, **{**ok, "s3:delimiter": ","}) \
        is Decision.NONE
    p = policy(stmt(Condition={"Null": {"aws:username": "true"}}))
    assert decide(p, ANONYMOUS, "s3:GetObject", "k") is Decision.ALLOW
    assert decide(p, ALICE, "s3:GetObject", "k", **{"aws:username": "alice"}) is Decision.NONE


def test_single_statement_object_and_2008_version() -> None:
    p = parse_policy(json.dumps({"Statement": stmt()}), B)
    assert p.version == "2008-10-17" and len(p.statements) == 1
    assert policy(stmt(), version="2008-10-17").version == "2008-10-17"


# -- validation ---------------------------------------------------------------------------

@pytest.mark.parametrize(("doc", "match"), [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe", "UTF-8"),
    (b"", "empty"),
    ("[]", "JSON object"),
    ({"Statement": []}, "non-empty"),
    ({"Version": "2020-01-01", "Statement": [stmt()]}, "invalid Version"),
    ({"Version": "2012-10-17"}, "missing required field Statement"),
    ({"Statement": [stmt()], "Extra": 1}, "unknown field 'Extra'"),
    ({"Statement": [stmt(effect="Maybe")]}, "invalid effect 'Maybe'"),
    ({"Statement": [stmt(action="s3:GetObjekt")]}, "unknown action 's3:GetObjekt'"),
    ({"Statement": [stmt(action="ec2:RunInstances")]}, "invalid action"),
    ({"Statement": [stmt(action="s3:Frob*")]}, "unknown action"),
    ({"Statement": [stmt(resource="arn:aws:s3:::other/*")]}, "not in bucket 'data'"),
    ({"Statement": [stmt(resource="data/*")]}, "invalid resource"),
    ({"Statement": [stmt(resource=f"arn:aws:s3:::{B}")]}, "do not apply to any"),
    ({"Statement": [stmt(Condition={"IpAddress": {"aws:SourceIp": "300.1.2.3/8"}})]},
     "invalid IP address or CIDR '300.1.2.3/8'"),
    ({"Statement": [stmt(Condition={"IpAddress": {"aws:SourceIp": "10.0.0.0/99"}})]},
     "CIDR"),
    ({"Statement": [stmt(Condition={"StringEquals": {"aws:Nope": "x"}})]},
     "unknown condition key 'aws:Nope'"),
    ({"Statement": [stmt(Condition={"DateEquals": {"aws:username": "x"}})]},
     "unknown condition operator 'DateEquals'"),
    ({"Statement": [stmt(Condition={"ForAnyValue:StringEquals": {"s3:prefix": "x"}})]},
     "not supported"),
    ({"Statement": [stmt(Condition={"NumericEquals": {"s3:max-keys": "ten"}})]},
     "not a number"),
    ({"Statement": [stmt(principal={"Service": "s3.amazonaws.com"})]}, "'Service'"),
    ({"Statement": [stmt(principal={"AWS": "ali*"})]}, "invalid principal"),
    ({"Statement": [{"Effect": "Allow", "Action": "s3:GetObject",
                     "Resource": f"arn:aws:s3:::{B}/*"}]}, "Principal"),
    ({"Statement": [{"Effect": "Allow", "Principal": "*",
                     "Resource": f"arn:aws:s3:::{B}/*"}]}, "Action and NotAction"),
    ({"Statement": [stmt(Sid="a"), stmt(Sid="a")]}, "unique"),
    ({"Statement": [stmt(Condition={"StringEquals": {"s3:prefix": [{"x": 1}]}})]},
     "condition values"),
])
def test_malformed(doc: Any, match: str) -> None:
    malformed(doc, match)


def test_size_limit() -> None:
    big = {"Statement": [stmt(Sid="x" * MAX_POLICY_BYTES)]}
    malformed(big, "20 KiB")
    # just under the limit is fine
    pad = MAX_POLICY_BYTES - len(json.dumps({"Statement": [stmt(Sid="")]})) - 10
    assert parse_policy(json.dumps({"Statement": [stmt(Sid="y" * pad)]}), B)


def test_deep_nesting_is_malformed_not_a_crash() -> None:
    malformed("[" * 10000 + "]" * 10000, "nested too deeply|JSON object")
    malformed('{"Statement": ' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply|Statement")


# -- fuzz ---------------------------------------------------------------------------------

def _parses_or_malformed(raw: bytes | str) -> None:
    try:
        p = parse_policy(raw, B)
    except MalformedPolicy as e:
        assert str(e)
        return
    # a policy that parsed evaluates without error for any request
    for who in (ANONYMOUS, ALICE):
        for action, key in (("s3:GetObject", "a/b"), ("s3:ListBucket", None)):
            d, _ = p.evaluate(Request(who, action, B, key, {"aws:sourceip": "127.0.0.1",
                                                            "s3:prefix": "a/"}))
            assert isinstance(d, Decision)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
_words = st.sampled_from([
    "*", "s3:GetObject", "s3:Get*", "s3:*", "s3:Nope", "arn:aws:s3:::data",
    "arn:aws:s3:::data/*", "arn:aws:s3:::other/*", "Allow", "Deny", "127.0.0.0/8", "bad/99",
    "alice", "2012-10-17",
])
_leaf = json_values | _words
statement_like = st.fixed_dictionaries(
    {},
    optional={
        "Sid": _leaf, "Effect": _leaf,
        "Principal": _leaf | st.fixed_dictionaries({"AWS": _leaf | st.lists(_leaf)}),
        "Action": _leaf | st.lists(_leaf), "NotAction": _leaf,
        "Resource": _leaf | st.lists(_leaf), "NotResource": _leaf,
        "Condition": _leaf | st.dictionaries(
            st.sampled_from(["IpAddress", "NotIpAddress", "StringLike", "StringEquals",
                             "Bool", "NumericLessThan", "StringNotLikeIfExists", "Null", "X"]),
            st.dictionaries(st.sampled_from(["aws:SourceIp", "s3:prefix", "s3:max-keys",
                                             "aws:SecureTransport", "x"]),
                            _leaf | st.lists(_leaf), max_size=2), max_size=2),
    },
)
policy_like = st.fixed_dictionaries(
    {}, optional={"Version": _leaf, "Id": _leaf,
                  "Statement": statement_like | st.lists(statement_like, max_size=3)})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_fuzz_bytes(raw: bytes) -> None:
    _parses_or_malformed(raw)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_fuzz_any_json(doc: Any) -> None:
    _parses_or_malformed(json.dumps(doc))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_like)
def test_fuzz_policy_shaped_json(doc: Any) -> None:
    _parses_or_malformed(json.dumps(doc))


# -- the grant in the namespace -----------------------------------------------------------

async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_grant_covers_its_request_only_and_ends_at_symlinks(tmp_path: Path) -> None:
    """What authorize() hands the namespace: anonymous gets nothing from mode bits (not even
    "other"), a Grant opens what POSIX would refuse, and following a symlink ends it."""
    store = MetaStore.open_lmdb(tmp_path / "meta")
    ns = await open_namespace(store, tmp_path, umask=0o022)
    try:
        root = Identity.ROOT
        await ns.create_bucket(root, "bkt")  # private; shared with every user (0755):
        await ns.set_canned_acl(root, "bkt", "", "authenticated-read")
        await ns.put_object(root, "bkt", "private/s", _body(b"secret"),
                            {canned.META_KEY: "private"})
        await ns.put_object(root, "bkt", "pub/f", _body(b"f"), {canned.META_KEY: "private"})
        await ns.put_object(root, "bkt", "pub/open", _body(b"o"),
                            {canned.META_KEY: "public-read"})
        pub = await ns.resolve(root, "bkt/pub")
        await ns.symlink(root, pub.ino, b"link", b"../private/s")
        anon = Identity.ANONYMOUS
        alice = Identity(1000, 1000)
        assert (await ns.head_object(alice, "bkt", "pub/open")).size == 1  # other bits
        for key in ("pub/open", "pub/f"):  # (the bucket has no anonymous grant)
            with pytest.raises(FsError) as e:
                await ns.head_object(anon, "bkt", key)
            assert e.value.errno == errno.EACCES
        with pytest.raises(FsError):
            await ns.head_object(alice, "bkt", "pub/f")

        def granted(who: Identity) -> Identity:
            return Identity(who.uid, who.gid, who.groups, Grant(GRANT_MASK), who.anonymous)

        assert (await ns.head_object(granted(anon), "bkt", "pub/f")).size == 1
        assert (await ns.head_object(granted(alice), "bkt", "pub/f")).size == 1
        g = granted(alice)
        with pytest.raises(FsError) as e:
            await ns.head_object(g, "bkt", "pub/link")
        assert e.value.errno == errno.EACCES
        assert g.grant is not None and not g.grant.active  # ended for the rest of it
        # an anonymous write under a grant is owned by "nobody"
        made = await ns.put_object(granted(anon), "bkt", "pub/new", _body(b"n"))
        assert (made.uid, made.gid) == (ANONYMOUS_ID, ANONYMOUS_ID)
    finally:
        await close_namespace(ns)
        store.close()
