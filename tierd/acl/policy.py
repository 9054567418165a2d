"""S3 bucket policies: the IAM JSON subset tierd understands, its validation and evaluation.

A policy is parsed once, when it is PUT (:func:`parse_policy`): anything outside the subset
or inconsistent with the bucket raises :class:`MalformedPolicy` with a message naming what is
wrong, so a stored policy always evaluates without surprises.  Evaluation
(:meth:`Policy.evaluate`) follows IAM: an explicit Deny wins over everything, an Allow grants
the request, and with no matching statement the answer is :data:`Decision.NONE` -- POSIX
(mode bits and ACLs) decides as if there were no policy.  :mod:`tierd.acl.authorize` turns the
decision into the identity the namespace sees; this module only knows JSON and strings.

The subset: ``Version`` (2012-10-17 or 2008-10-17), ``Id``, ``Statement`` (one object or a
list) with ``Sid``, ``Effect`` (Allow|Deny), ``Principal`` (``"*"``, ``{"AWS": ...}`` with
``*``, access keys, user names or ``arn:aws:iam::ACCOUNT:user/NAME``, and
``{"CanonicalUser": ...}``), ``Action`` or ``NotAction`` (``s3:`` names, wildcards ``*`` and
``?``), ``Resource`` or ``NotResource`` (``arn:aws:s3:::bucket`` and object ARNs in this
bucket, wildcards) and ``Condition`` (string, IP, numeric and Bool operators, ``...IfExists``,
on the keys in :data:`CONDITION_KEYS` and the tag keys of :data:`TAG_CONDITION_PREFIXES`).
"""

from __future__ import annotations

import enum
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: AWS's limit on the size of a bucket policy
MAX_POLICY_BYTES = 20 * 1024
VERSIONS = ("2012-10-17", "2008-10-17")
ARN_PREFIX = "arn:aws:s3:::"

#: S3 actions on a bucket (the resource ``arn:aws:s3:::bucket``)
BUCKET_ACTIONS = frozenset({
    "s3:CreateBucket", "s3:DeleteBucket", "s3:ListBucket", "s3:ListBucketVersions",
    "s3:ListBucketMultipartUploads", "s3:GetBucketLocation", "s3:GetBucketVersioning",
    "s3:PutBucketVersioning", "s3:GetBucketPolicy", "s3:PutBucketPolicy",
    "s3:DeleteBucketPolicy", "s3:GetBucketPolicyStatus", "s3:GetBucketAcl", "s3:PutBucketAcl",
    "s3:GetBucketCORS", "s3:PutBucketCORS", "s3:GetBucketTagging", "s3:PutBucketTagging",
    "s3:GetBucketLogging", "s3:PutBucketLogging", "s3:GetBucketNotification",
    "s3:PutBucketNotification", "s3:GetBucketWebsite", "s3:PutBucketWebsite",
    "s3:DeleteBucketWebsite", "s3:GetLifecycleConfiguration", "s3:PutLifecycleConfiguration",
    "s3:GetEncryptionConfiguration", "s3:PutEncryptionConfiguration",
    "s3:GetReplicationConfiguration", "s3:PutReplicationConfiguration",
    "s3:GetBucketObjectLockConfiguration", "s3:PutBucketObjectLockConfiguration",
    "s3:GetBucketOwnershipControls", "s3:PutBucketOwnershipControls",
    "s3:GetBucketPublicAccessBlock", "s3:PutBucketPublicAccessBlock",
    "s3:GetBucketRequestPayment", "s3:PutBucketRequestPayment", "s3:GetAccelerateConfiguration",
    "s3:PutAccelerateConfiguration", "s3:GetAnalyticsConfiguration",
    "s3:PutAnalyticsConfiguration", "s3:GetInventoryConfiguration",
    "s3:PutInventoryConfiguration", "s3:GetMetricsConfiguration", "s3:PutMetricsConfiguration",
    "s3:GetIntelligentTieringConfiguration", "s3:PutIntelligentTieringConfiguration",
})
#: S3 actions on objects (``arn:aws:s3:::bucket/key``)
OBJECT_ACTIONS = frozenset({
    "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:GetObjectAcl", "s3:PutObjectAcl",
    "s3:GetObjectVersion", "s3:DeleteObjectVersion", "s3:GetObjectVersionAcl",
    "s3:PutObjectVersionAcl", "s3:GetObjectAttributes", "s3:GetObjectVersionAttributes",
    "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts", "s3:GetObjectTagging",
    "s3:PutObjectTagging", "s3:DeleteObjectTagging", "s3:GetObjectVersionTagging",
    "s3:PutObjectVersionTagging", "s3:DeleteObjectVersionTagging", "s3:GetObjectRetention",
    "s3:PutObjectRetention", "s3:GetObjectLegalHold", "s3:PutObjectLegalHold",
    "s3:RestoreObject", "s3:GetObjectTorrent", "s3:BypassGovernanceRetention",
    "s3:ReplicateObject", "s3:ReplicateDelete", "s3:ReplicateTags",
})
#: actions on no resource of a bucket (a bucket policy may name them; they never match)
SERVICE_ACTIONS = frozenset({"s3:ListAllMyBuckets"})
ACTIONS = BUCKET_ACTIONS | OBJECT_ACTIONS | SERVICE_ACTIONS
_ACTIONS_LOWER = {a.lower(): a for a in ACTIONS}

#: condition keys a policy may test (compared case-insensitively); how each is filled in
#: for a request is :class:`Request`'s business
CONDITION_KEYS = frozenset({
    "aws:sourceip", "aws:securetransport", "aws:username", "aws:userid", "aws:useragent",
    "aws:referer", "aws:principaltype", "aws:epochtime", "s3:prefix", "s3:delimiter",
    "s3:max-keys", "s3:x-amz-acl", "s3:x-amz-content-sha256", "s3:authtype",
    "s3:signatureversion", "s3:x-amz-copy-source", "s3:x-amz-metadata-directive",
    "s3:x-amz-storage-class",
})
#: condition keys named after a tag (``s3:ExistingObjectTag/<tag key>``: the object's stored
#: tags; ``s3:RequestObjectTag/<tag key>``: the tags the request sets).  Like every condition
#: key name they compare case-insensitively, the tag key included; the door fills them in
EXISTING_OBJECT_TAG = "s3:existingobjecttag/"
REQUEST_OBJECT_TAG = "s3:requestobjecttag/"
TAG_CONDITION_PREFIXES = (EXISTING_OBJECT_TAG, REQUEST_OBJECT_TAG)

_STRING_OPS = {"StringEquals", "StringNotEquals", "StringEqualsIgnoreCase",
               "StringNotEqualsIgnoreCase", "StringLike", "StringNotLike"}
_NUMERIC_OPS = {"NumericEquals", "NumericNotEquals", "NumericLessThan",
                "NumericLessThanEquals", "NumericGreaterThan", "NumericGreaterThanEquals"}
_IP_OPS = {"IpAddress", "NotIpAddress"}
_OPERATORS = _STRING_OPS | _NUMERIC_OPS | _IP_OPS | {"Bool", "Null"}
#: operators that hold when the key is absent from the request (IAM's negated matching)
_NEGATED = {"StringNotEquals", "StringNotEqualsIgnoreCase", "StringNotLike",
            "NumericNotEquals", "NotIpAddress"}

_STATEMENT_FIELDS = {"Sid", "Effect", "Principal", "NotPrincipal", "Action", "NotAction",
                     "Resource", "NotResource", "Condition"}
_IAM_USER = re.compile(r"^arn:aws:iam::[^:]*:user/(?:.*/)?([^/]+)$")


class MalformedPolicy(ValueError):
    """The policy cannot be stored; the message says why (S3's ``MalformedPolicy``, 400)."""


class Decision(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"
    NONE = "none"  # no statement applies: POSIX decides


def _glob(pattern: str, ignore_case: bool = False) -> re.Pattern[str]:
    """IAM wildcards: ``*`` any run of characters (``/`` included), ``?`` one character."""
    out = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(out, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


@dataclass(frozen=True, slots=True)
class Requester:
    """Who sends a request, as a policy sees it.  ``access_key`` is None for an anonymous
    (unsigned) request, which only ``Principal: "*"`` matches."""

    access_key: str | None
    user: str = ""
    canonical_id: str = ""

    @property
    def anonymous(self) -> bool:
        return self.access_key is None


ANONYMOUS = Requester(None)


@dataclass(frozen=True, slots=True)
class Request:
    """One S3 request to authorize: the action (``s3:GetObject``), the bucket and key it is
    on (``key`` None for bucket actions) and the values of the condition keys it carries
    (lower-case names, e.g. ``aws:sourceip``, ``s3:prefix``)."""

    requester: Requester
    action: str
    bucket: str
    key: str | None = None
    context: Mapping[str, str] = field(default_factory=dict)

    @property
    def resource(self) -> str:
        if self.key is None:
            return ARN_PREFIX + self.bucket
        return f"{ARN_PREFIX}{self.bucket}/{self.key}"


@dataclass(frozen=True, slots=True)
class Principal:
    everyone: bool  # "*": every requester, anonymous included
    names: frozenset[str] = frozenset()  # access keys and user names
    canonical: frozenset[str] = frozenset()

    def matches(self, who: Requester) -> bool:
        if self.everyone:
            return True
        if who.anonymous:
            return False
        return (who.access_key in self.names or bool(who.user and who.user in self.names)
                or bool(who.canonical_id and who.canonical_id in self.canonical))


@dataclass(frozen=True, slots=True)
class Condition:
    operator: str  # without the IfExists suffix
    key: str  # lower case
    values: tuple[str, ...]
    if_exists: bool = False
    _patterns: tuple[re.Pattern[str], ...] = ()
    _networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    _numbers: tuple[float, ...] = ()

    def holds(self, context: Mapping[str, str]) -> bool:
        value = context.get(self.key)
        if self.operator == "Null":
            return (value is None) == (self.values[0] == "true")
        if value is None:
            return self.if_exists or self.operator in _NEGATED
        op = self.operator
        if op in ("StringEquals", "StringNotEquals"):
            hit = value in self.values
        elif op in ("StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase"):
            hit = value.lower() in (v.lower() for v in self.values)
        elif op in ("StringLike", "StringNotLike"):
            hit = any(p.fullmatch(value) for p in self._patterns)
        elif op in _IP_OPS:
            try:
                ip = ipaddress.ip_address(value)
            except ValueError:
                return op == "NotIpAddress"
            hit = any(ip in n for n in self._networks)
        elif op == "Bool":
            hit = value.lower() in (v.lower() for v in self.values)
        else:
            try:
                x = float(value)
            except ValueError:
                return op == "NumericNotEquals"
            hit = any(_compare(op, x, n) for n in self._numbers)
        return not hit if op in _NEGATED else hit


def _compare(op: str, x: float, n: float) -> bool:
    if op in ("NumericEquals", "NumericNotEquals"):
        return x == n
    if op == "NumericLessThan":
        return x < n
    if op == "NumericLessThanEquals":
        return x <= n
    if op == "NumericGreaterThan":
        return x > n
    return x >= n


@dataclass(frozen=True, slots=True)
class Statement:
    sid: str
    allow: bool
    principal: Principal
    actions: tuple[re.Pattern[str], ...]
    not_action: bool
    resources: tuple[re.Pattern[str], ...]
    not_resource: bool
    conditions: tuple[Condition, ...] = ()

    def applies(self, req: Request) -> bool:
        if not self.principal.matches(req.requester):
            return False
        if any(p.fullmatch(req.action) for p in self.actions) == self.not_action:
            return False
        if any(p.fullmatch(req.resource) for p in self.resources) == self.not_resource:
            return False
        return all(c.holds(req.context) for c in self.conditions)


@dataclass(frozen=True, slots=True)
class Policy:
    """A validated bucket policy; ``text`` is the JSON exactly as it was PUT."""

    text: str
    bucket: str
    version: str
    statements: tuple[Statement, ...]

    def evaluate(self, req: Request) -> tuple[Decision, str]:
        """The decision for ``req`` and the Sid of the statement that made it ("" when
        none did).  Deny wins over Allow wherever they are in the policy."""
        allowed: Statement | None = None
        for st in self.statements:
            if st.applies(req):
                if not st.allow:
                    return Decision.DENY, st.sid
                allowed = allowed or st
        if allowed is not None:
            return Decision.ALLOW, allowed.sid
        return Decision.NONE, ""

    def tests(self, prefix: str) -> bool:
        """Some condition tests a key starting with ``prefix`` (lower case): lets the door
        skip looking up what no statement reads, e.g. an object's stored tags."""
        return any(c.key.startswith(prefix) for st in self.statements for c in st.conditions)

    @property
    def public(self) -> bool:
        """Some Allow statement names every requester without a condition (what AWS's
        GetBucketPolicyStatus calls public)."""
        return any(st.allow and st.principal.everyone and not st.conditions
                   for st in self.statements)


# -- parsing -------------------------------------------------------------------------------

def parse_policy(raw: bytes | str, bucket: str) -> Policy:
    """Validate ``raw`` as the policy of ``bucket``; :class:`MalformedPolicy` otherwise."""
    if isinstance(raw, str):
        try:
            raw = raw.encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedPolicy("the policy is not valid UTF-8") from None
    if len(raw) > MAX_POLICY_BYTES:
        raise MalformedPolicy(f"the policy is {len(raw)} bytes; the limit is "
                              f"{MAX_POLICY_BYTES} (20 KiB)")
    if not raw.strip():
        raise MalformedPolicy("the policy is empty")
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise MalformedPolicy("the policy is not valid UTF-8") from None
    except RecursionError:
        raise MalformedPolicy("the policy is nested too deeply") from None
    except ValueError as e:
        raise MalformedPolicy(f"the policy is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise MalformedPolicy("the policy must be a JSON object")
    unknown = sorted(set(doc) - {"Version", "Id", "Statement"})
    if unknown:
        raise MalformedPolicy(f"unknown field {unknown[0]!r} in the policy (expected "
                              "Version, Id, Statement)")
    version = doc.get("Version", "2008-10-17")
    if version not in VERSIONS:
        raise MalformedPolicy(f"the policy has an invalid Version {version!r}; use "
                              "\"2012-10-17\"")
    if "Id" in doc and not isinstance(doc["Id"], str):
        raise MalformedPolicy("Id must be a string")
    if "Statement" not in doc:
        raise MalformedPolicy("missing required field Statement")
    raw_statements = doc["Statement"]
    if isinstance(raw_statements, dict):
        raw_statements = [raw_statements]
    if not isinstance(raw_statements, list) or not raw_statements:
        raise MalformedPolicy("Statement must be a non-empty list of statements")
    statements = tuple(_statement(s, i, bucket) for i, s in enumerate(raw_statements))
    sids = [s.sid for s in statements if s.sid]
    if len(sids) != len(set(sids)):
        raise MalformedPolicy("statement ids (Sid) must be unique")
    return Policy(text, bucket, version, statements)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _strings(value: Any, what: str, where: str) -> list[str]:
    """A string or a non-empty list of strings."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise MalformedPolicy(f"{where}: {what} must be a string or a non-empty list of strings")


def _statement(st: Any, index: int, bucket: str) -> Statement:
    where = f"statement {index + 1}"
    if not isinstance(st, dict):
        raise MalformedPolicy(f"{where} must be a JSON object")
    sid = st.get("Sid", "")
    if not isinstance(sid, str):
        raise MalformedPolicy(f"{where}: Sid must be a string")
    if sid:
        where = f"statement {sid!r}"
    unknown = sorted(set(st) - _STATEMENT_FIELDS)
    if unknown:
        raise MalformedPolicy(f"{where}: unknown field {unknown[0]!r}")
    effect = st.get("Effect")
    if effect not in ("Allow", "Deny"):
        raise MalformedPolicy(f"{where}: invalid effect {effect!r}; Effect must be \"Allow\" "
                              "or \"Deny\"")
    if "NotPrincipal" in st:
        raise MalformedPolicy(f"{where}: NotPrincipal is not supported by tierd")
    if "Principal" not in st:
        raise MalformedPolicy(f"{where}: missing required field Principal")
    principal = _principal(st["Principal"], where)
    actions, not_action, kinds = _actions(st, where)
    resources, not_resource, rkinds = _resources(st, where, bucket)
    if not not_action and not not_resource and not kinds & rkinds:
        raise MalformedPolicy(f"{where}: the actions do not apply to any of the resources "
                              "(object actions need an object ARN such as "
                              f"'{ARN_PREFIX}{bucket}/*', bucket actions the bucket ARN "
                              f"'{ARN_PREFIX}{bucket}')")
    conditions = _conditions(st.get("Condition"), where)
    return Statement(sid, effect == "Allow", principal, actions, not_action, resources,
                     not_resource, conditions)


def _principal(value: Any, where: str) -> Principal:
    if value == "*":
        return Principal(True)
    if not isinstance(value, dict) or not value:
        raise MalformedPolicy(f"{where}: invalid principal; use \"*\" or {{\"AWS\": [...]}}")
    names: set[str] = set()
    canonical: set[str] = set()
    everyone = False
    for kind, raw in value.items():
        if kind == "AWS":
            for name in _strings(raw, "Principal AWS", where):
                if name == "*":
                    everyone = True
                    continue
                m = _IAM_USER.match(name)
                if m:
                    name = m.group(1)
                if not name or "*" in name or "?" in name or not name.isprintable():
                    raise MalformedPolicy(f"{where}: invalid principal {name!r}: name an "
                                          "access key, a user or "
                                          "arn:aws:iam::ACCOUNT:user/NAME")
                names.add(name)
        elif kind == "CanonicalUser":
            canonical.update(_strings(raw, "Principal CanonicalUser", where))
        else:
            raise MalformedPolicy(f"{where}: principal type {kind!r} is not supported (use "
                                  "AWS or CanonicalUser)")
    return Principal(everyone, frozenset(names), frozenset(canonical))


def _actions(st: dict[str, Any], where: str) -> tuple[tuple[re.Pattern[str], ...], bool,
                                                      set[str]]:
    """Compiled action patterns, whether they are NotAction, and the resource kinds
    ("bucket", "object") they touch."""
    if ("Action" in st) == ("NotAction" in st):
        raise MalformedPolicy(f"{where}: give exactly one of Action and NotAction")
    name = "Action" if "Action" in st else "NotAction"
    patterns: list[re.Pattern[str]] = []
    kinds: set[str] = set()
    for action in _strings(st[name], name, where):
        if action == "*":
            pattern = _glob("*")
            matched: Iterable[str] = ACTIONS
        else:
            service, sep, op = action.partition(":")
            if not sep or service.lower() != "s3" or not op:
                raise MalformedPolicy(f"{where}: invalid action {action!r}: actions are "
                                      "'s3:NAME' (wildcards * and ? allowed)")
            pattern = _glob(action, ignore_case=True)
            matched = [a for a in ACTIONS if pattern.fullmatch(a)]
            if not matched:
                raise MalformedPolicy(f"{where}: unknown action {action!r}")
        patterns.append(pattern)
        for a in matched:
            kinds.add("object" if a in OBJECT_ACTIONS else "bucket" if a in BUCKET_ACTIONS
                      else "service")
    return tuple(patterns), name == "NotAction", kinds


def _resources(st: dict[str, Any], where: str, bucket: str
               ) -> tuple[tuple[re.Pattern[str], ...], bool, set[str]]:
    if ("Resource" in st) == ("NotResource" in st):
        raise MalformedPolicy(f"{where}: give exactly one of Resource and NotResource")
    name = "Resource" if "Resource" in st else "NotResource"
    patterns: list[re.Pattern[str]] = []
    kinds: set[str] = set()
    for res in _strings(st[name], name, where):
        if res == "*":
            patterns.append(_glob("*"))
            kinds.update(("bucket", "object"))
            continue
        if not res.startswith(ARN_PREFIX):
            raise MalformedPolicy(f"{where}: invalid resource {res!r}: resources are "
                                  f"'{ARN_PREFIX}{bucket}' or '{ARN_PREFIX}{bucket}/KEY' "
                                  "(wildcards allowed)")
        path = res[len(ARN_PREFIX):]
        bucket_part, slash, _ = path.partition("/")
        if not _glob(bucket_part).fullmatch(bucket):
            raise MalformedPolicy(f"{where}: resource {res!r} is not in bucket {bucket!r}: "
                                  "a bucket policy names only its own bucket")
        pattern = _glob(res)
        if pattern.fullmatch(ARN_PREFIX + bucket):
            kinds.add("bucket")
        if slash or "*" in bucket_part:
            kinds.add("object")
        patterns.append(pattern)
    return tuple(patterns), name == "NotResource", kinds


def _scalar(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    if isinstance(v, int | float):
        return str(v)
    raise MalformedPolicy(f"{where}: condition values must be strings, numbers or booleans")


def _conditions(block: Any, where: str) -> tuple[Condition, ...]:
    if block is None:
        return ()
    if not isinstance(block, dict):
        raise MalformedPolicy(f"{where}: Condition must be an object of operators")
    out: list[Condition] = []
    for raw_op, tests in block.items():
        op = raw_op.removesuffix("IfExists")
        if_exists = op != raw_op
        if ":" in op:
            raise MalformedPolicy(f"{where}: condition set operator {raw_op!r} "
                                  "(ForAnyValue/ForAllValues) is not supported")
        if op not in _OPERATORS or (if_exists and op == "Null"):
            raise MalformedPolicy(f"{where}: unknown condition operator {raw_op!r}")
        if not isinstance(tests, dict) or not tests:
            raise MalformedPolicy(f"{where}: {raw_op} must map condition keys to values")
        for key, raw_values in tests.items():
            lkey = key.lower()
            tagged = lkey.startswith(TAG_CONDITION_PREFIXES) and not lkey.endswith("/")
            if lkey not in CONDITION_KEYS and not tagged:
                raise MalformedPolicy(f"{where}: unknown condition key {key!r} (supported: "
                                      f"{', '.join(sorted(CONDITION_KEYS))}, "
                                      "s3:ExistingObjectTag/<key>, s3:RequestObjectTag/<key>)")
            items = raw_values if isinstance(raw_values, list) else [raw_values]
            if not items:
                raise MalformedPolicy(f"{where}: {raw_op} {key}: no values")
            values = tuple(_scalar(v, where) for v in items)
            out.append(_condition(op, lkey, values, if_exists, f"{where}: {raw_op} {key}"))
    return tuple(out)


def _condition(op: str, key: str, values: tuple[str, ...], if_exists: bool,
               where: str) -> Condition:
    if op in _IP_OPS:
        if key != "aws:sourceip":
            raise MalformedPolicy(f"{where}: {op} applies only to aws:SourceIp")
        nets = []
        for v in values:
            try:
                nets.append(ipaddress.ip_network(v.strip(), strict=False))
            except ValueError:
                raise MalformedPolicy(f"{where}: invalid IP address or CIDR {v!r}") from None
        return Condition(op, key, values, if_exists, _networks=tuple(nets))
    if op in _NUMERIC_OPS:
        nums = []
        for v in values:
            try:
                nums.append(float(v))
            except ValueError:
                raise MalformedPolicy(f"{where}: {v!r} is not a number") from None
        return Condition(op, key, values, if_exists, _numbers=tuple(nums))
    if op in ("Bool", "Null"):
        if any(v.lower() not in ("true", "false") for v in values):
            raise MalformedPolicy(f"{where}: {op} takes \"true\" or \"false\"")
        return Condition(op, key, tuple(v.lower() for v in values), if_exists)
    if key == "aws:sourceip":
        raise MalformedPolicy(f"{where}: test aws:SourceIp with IpAddress or NotIpAddress")
    pats = tuple(_glob(v) for v in values) if op in ("StringLike", "StringNotLike") else ()
    return Condition(op, key, values, if_exists, _patterns=pats)
