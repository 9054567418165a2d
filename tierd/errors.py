"""The error every layer raises: an errno and a message a person can act on.

Doors map it to their protocol (FUSE replies with the errno, S3 picks an error code from the
errno and keeps the message), so a rule is written once with one error.  Where object
semantics have failures that no errno tells apart (a multipart part list in the wrong order,
an unknown upload), ``reason`` names the condition; the S3 door maps it to its error code.
"""

from __future__ import annotations

import errno as _errno


class FsError(OSError):
    """An operation failed with ``errno``; ``str(err)`` explains why."""

    def __init__(self, err: int, message: str, reason: str = "") -> None:
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
