"""The error every layer raises: an errno and a message a person can act on.

Doors map it to their protocol (FUSE replies with the errno, S3 picks an error code from the
errno and keeps the message), so a rule is written once with one error.  Where object
semantics have failures that no errno tells apart (a multipart part list in the wrong order,
an unknown upload), ``reason`` names the condition (a :class:`Reason`); the S3 door answers
with the error code it is named by.
"""

from __future__ import annotations

import enum
import errno as _errno


class Reason(enum.StrEnum):
    """A failure the errno alone does not tell apart, for the doors that must (the S3 door
    answers each with its own error code; the FUSE door has only the errno).  Each value
    is that S3 error code, so the mapping is written nowhere else; the persister also reads
    SERVICE_UNAVAILABLE as "the cold store's fault, not this file's"."""

    NO_SUCH_KEY = "NoSuchKey"  # the object is gone (deleted meanwhile, or outside tierd)
    NO_SUCH_VERSION = "NoSuchVersion"
    NO_SUCH_UPLOAD = "NoSuchUpload"
    METHOD_NOT_ALLOWED = "MethodNotAllowed"  # a delete marker asked for by version id
    MALFORMED_XML = "MalformedXML"  # a request document's content is wrong
    INVALID_ARGUMENT = "InvalidArgument"
    INVALID_RANGE = "InvalidRange"
    INVALID_PART = "InvalidPart"
    INVALID_PART_ORDER = "InvalidPartOrder"
    ENTITY_TOO_SMALL = "EntityTooSmall"  # a multipart part under the minimum size
    INCOMPLETE_BODY = "IncompleteBody"  # fewer or more bytes than announced
    PRECONDITION_FAILED = "PreconditionFailed"  # If-Match / If-None-Match found false
    SLOW_DOWN = "SlowDown"  # too much waits to be persisted: retry later
    SERVICE_UNAVAILABLE = "ServiceUnavailable"  # the cold store did not answer


class FsError(OSError):
    """An operation failed with ``errno``; ``str(err)`` explains why."""

    def __init__(self, err: int, message: str, reason: Reason | None = None) -> None:
        super().__init__(err, message)
        self.message = message
        self.reason = reason

    def __str__(self) -> str:
        return f"[{_errno.errorcode.get(self.errno or 0, self.errno)}] {self.message}"


#: errnos that say "out of space" (a full file system, map or quota): an answer the doors
#: give (ENOSPC, S3 507), never an I/O error
NO_SPACE = frozenset({_errno.ENOSPC, _errno.EDQUOT})


def no_space(e: BaseException) -> bool:
    """Whether ``e`` says there is no room left (see :data:`NO_SPACE`)."""
    return isinstance(e, OSError) and e.errno in NO_SPACE
