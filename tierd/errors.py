"""The error every layer raises: an errno and a message a person can act on.

Doors map it to their protocol (FUSE replies with the errno, S3 picks an error code from the
errno and keeps the message), so a rule is written once with one error.
"""

from __future__ import annotations

import errno as _errno


class FsError(OSError):
    """An operation failed with ``errno``; ``str(err)`` explains why."""

    def __init__(self, err: int, message: str) -> None:
        super().__init__(err, message)
        self.message = message

    def __str__(self) -> str:
        return f"[{_errno.errorcode.get(self.errno or 0, self.errno)}] {self.message}"
