"""Request signing between the nodes of a cluster (the peer data door).

Every request one node sends another's peer door carries three headers:

* ``X-Tierd-Node``: the sender's ``node_name``;
* ``X-Tierd-Date``: the sender's clock, whole seconds since the epoch;
* ``Authorization: TIERD-HMAC <hex>``: HMAC-SHA256, keyed by the shared ``cluster_secret``,
  of the canonical string of the request (:func:`canonical`): a version tag, the method, the
  path, the query pairs sorted, the sender's name and the date, one per line.

Why an HMAC and not TLS client certificates: the nodes already share one secret setting, it
needs no certificate authority, and what must be proved is only "a node of this cluster sent
this"; the bytes themselves travel in the clear (run the door on a private network, or put
it behind a TLS proxy; docs/cluster.md).  The date bounds replays: a request whose date is
more than :data:`MAX_SKEW_S` away from the receiver's clock is refused, so a captured request
can be replayed only within that window, and it only reads (every peer request is a ``GET``).
The nodes' clocks must agree to within that window (NTP), which the registry's heartbeat
leases (:mod:`tierd.peer.registry`) need anyway.

Neither the secret nor a signature is ever logged or put in an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Iterable, Mapping
from urllib.parse import quote

HDR_NODE = "X-Tierd-Node"
HDR_DATE = "X-Tierd-Date"
HDR_AUTH = "Authorization"
SCHEME = "TIERD-HMAC"
#: how far (seconds) a request's date may be from the receiver's clock, either way
MAX_SKEW_S = 300
_VERSION = "TIERD-HMAC-V1"
_NODE_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_HEX_RE = re.compile(r"[0-9a-f]{64}")


class AuthError(Exception):
    """A request is refused: ``status`` 401 (not signed, or signed in a form this door does
    not read) or 403 (signed, but the signature or the date is wrong)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def canonical(method: str, path: str, query: Iterable[tuple[str, str]], node: str,
              date: int) -> bytes:
    """The string a signature covers.  The query pairs are percent-encoded and sorted, so
    the order a client library puts them in does not matter; each field is on its own line
    and none may hold a newline, so no two requests share a string."""
    pairs = sorted((quote(k, safe=""), quote(v, safe="")) for k, v in query)
    q = "&".join(f"{k}={v}" for k, v in pairs)
    return "\n".join((_VERSION, method.upper(), quote(path, safe="/"), q, node,
                      str(date))).encode()


def _mac(secret: str, msg: bytes) -> str:
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def sign(secret: str, node: str, method: str, path: str,
         query: Mapping[str, str], *, now: float | None = None) -> dict[str, str]:
    """The headers that sign a request from ``node`` (``now``: the date to sign with, for
    tests; default the clock)."""
    date = int(time.time() if now is None else now)
    mac = _mac(secret, canonical(method, path, query.items(), node, date))
    return {HDR_NODE: node, HDR_DATE: str(date), HDR_AUTH: f"{SCHEME} {mac}"}


def verify(secret: str, method: str, path: str, query: Iterable[tuple[str, str]],
           headers: Mapping[str, str], *, now: float | None = None,
           max_skew_s: float = MAX_SKEW_S) -> str:
    """The name of the node that signed this request, or :class:`AuthError`.  The
    signature is compared in constant time (:func:`hmac.compare_digest`), and before the
    date is judged, so a wrong secret is told apart from a wrong clock only by a caller
    that holds the secret."""
    auth = headers.get(HDR_AUTH)
    node = headers.get(HDR_NODE)
    date_s = headers.get(HDR_DATE)
    if auth is None or node is None or date_s is None:
        raise AuthError(401, f"peer requests must be signed ({HDR_AUTH}: {SCHEME}, "
                             f"{HDR_NODE} and {HDR_DATE})")
    scheme, _, mac = auth.partition(" ")
    if scheme != SCHEME or not _HEX_RE.fullmatch(mac.strip()):
        raise AuthError(401, f"the {HDR_AUTH} header is not {SCHEME} <64 hex digits>")
    if not _NODE_RE.fullmatch(node):
        raise AuthError(401, f"{HDR_NODE} is not a node name")
    if not date_s.isascii() or not date_s.isdigit() or len(date_s) > 12:
        raise AuthError(401, f"{HDR_DATE} is not whole seconds since the epoch")
    date = int(date_s)
    want = _mac(secret, canonical(method, path, query, node, date))
    if not hmac.compare_digest(want, mac.strip()):
        raise AuthError(403, f"the signature of node {node!r} is wrong: the nodes do not "
                             "share one cluster_secret")
    skew = (time.time() if now is None else now) - date
    if abs(skew) > max_skew_s:
        raise AuthError(403, f"the request of node {node!r} is dated {skew:+.0f} s from this "
                             f"node's clock (more than {max_skew_s:.0f} s): a replay, or "
                             "the nodes' clocks disagree (run NTP)")
    return node
