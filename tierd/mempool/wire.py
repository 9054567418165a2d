"""The pool socket's framing, shared by the daemon and the client SDK.

A message is a 4-byte big-endian length and a JSON object.  Requests carry ``op``; replies
carry ``ok`` and either the result fields or ``errno`` and ``error``.  File descriptors
(regions, checkpoint files) ride on a reply as SCM_RIGHTS ancillary data, attached to its
first byte, so they arrive with the reply that names them.
"""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from typing import Any

#: the documented place of a machine's pool socket: where a root daemon with the default
#: data directory listens (that directory is in root's home, which other users cannot
#: traverse), where the Kubernetes DaemonSet puts it, and where clients of any uid look
#: when they are not told (``TIERD_POOL_SOCKET``)
SHARED_SOCKET = Path("/run/tierd/pool.sock")

HEADER = struct.Struct(">I")
MAX_MESSAGE = 16 << 20  # a manifest of many tensors fits; anything larger is a bug or abuse
MAX_FDS = 8


class WireError(ConnectionError):
    """The peer sent something that is not a message, or went away mid-message."""


def encode(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    if len(body) > MAX_MESSAGE:
        raise WireError(f"message of {len(body)} bytes exceeds {MAX_MESSAGE}")
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(body)
    except (UnicodeDecodeError, ValueError) as e:
        raise WireError(f"message is not JSON: {e}") from None
    if not isinstance(msg, dict):
        raise WireError("message is not a JSON object")
    return msg


def frame_length(header: bytes) -> int:
    n: int = HEADER.unpack(header)[0]
    if n > MAX_MESSAGE:
        raise WireError(f"message of {n} bytes exceeds {MAX_MESSAGE}")
    return n


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Blocking receive of one message and the descriptors that came with it.  It reads
    no byte past the message: the next one (a pipelined reply) stays in the socket."""
    fds: list[int] = []
    buf = bytearray()
    need = HEADER.size
    body_len = -1
    while True:
        while len(buf) < need:
            data, got, _flags, _addr = socket.recv_fds(sock, need - len(buf), MAX_FDS)
            fds.extend(got)
            if not data:
                for fd in fds:
                    socket.close(fd)
                raise WireError("the tierd pool socket closed mid-message")
            buf += data
        if body_len < 0:
            body_len = frame_length(bytes(buf[:HEADER.size]))
            need = HEADER.size + body_len
            continue
        return decode(bytes(buf[HEADER.size:need])), fds
