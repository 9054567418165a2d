"""Authorization: identities and the one function that decides access (mode bits, POSIX
ACLs, bucket policies and canned ACLs; see :mod:`tierd.acl.authorize`)."""

from tierd.acl.identity import Identity
from tierd.acl.modes import (
    R_OK,
    W_OK,
    X_OK,
    AccessDenied,
    check_access,
    is_owner,
    may_access,
    may_delete,
)

__all__ = [
    "R_OK",
    "W_OK",
    "X_OK",
    "AccessDenied",
    "Identity",
    "check_access",
    "is_owner",
    "may_access",
    "may_delete",
]
