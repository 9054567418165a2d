"""The pool socket's framing (tierd/mempool/wire.py), over real socket pairs: a length and a
JSON object, descriptors riding on a message's first byte."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from tierd.mempool.wire import HEADER, MAX_MESSAGE, WireError, decode, encode, frame_length
from tierd.mempool.wire import recv_message as recv


def test_round_trip_of_every_json_value() -> None:
    msg = {"op": "alloc", "size": 3 << 20, "name": "ckpt/ü", "persistent": True,
           "list": [1, 2.5, None, {"x": "y"}]}
    data = encode(msg)
    assert frame_length(data[:HEADER.size]) == len(data) - HEADER.size
    assert decode(data[HEADER.size:]) == msg


@pytest.mark.parametrize("body", [b"not json", b"\xff\xfe", b"[1, 2]", b'"text"', b"3"])
def test_a_body_that_is_not_a_json_object_is_refused(body: bytes) -> None:
    with pytest.raises(WireError):
        decode(body)


def test_oversized_messages_are_refused_both_ways() -> None:
    with pytest.raises(WireError):
        encode({"blob": "x" * MAX_MESSAGE})
    with pytest.raises(WireError):
        frame_length(HEADER.pack(MAX_MESSAGE + 1))


def test_descriptors_arrive_with_their_message() -> None:
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        socket.send_fds(a, [encode({"ok": True, "n": 1})], [r])
        a.sendall(encode({"ok": True, "n": 2}))  # a second message, no descriptor
        msg, fds = recv(b)
        assert msg == {"ok": True, "n": 1} and len(fds) == 1
        os.write(w, b"through")
        assert os.read(fds[0], 7) == b"through"  # the same pipe, received
        os.close(fds[0])
        assert recv(b) == ({"ok": True, "n": 2}, [])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_a_message_sent_a_byte_at_a_time_arrives_whole() -> None:
    a, b = socket.socketpair()
    data = encode({"op": "stats", "pad": "p" * 10_000})

    def trickle() -> None:
        for i in range(0, 64):
            a.send(data[i:i + 1])
        a.sendall(data[64:])

    t = threading.Thread(target=trickle)
    t.start()
    try:
        assert recv(b)[0] == {"op": "stats", "pad": "p" * 10_000}
    finally:
        t.join()
        a.close()
        b.close()


def test_a_peer_gone_mid_message_is_an_error_and_its_descriptors_are_closed() -> None:
    a, b = socket.socketpair()
    r, w = os.pipe()
    data = encode({"op": "alloc"})
    socket.send_fds(a, [data[:-3]], [r])
    os.close(r)
    a.close()
    try:
        with pytest.raises(WireError):
            recv(b)
        # the received copy of the pipe's read end was closed: the write end sees no reader
        with pytest.raises(BrokenPipeError):
            os.write(w, b"x")
    finally:
        os.close(w)
        b.close()


def test_messages_sent_back_to_back_are_received_one_by_one() -> None:
    """Regression: the receiver read up to 4 KiB at a time and returned the first message,
    dropping whatever of the next one had arrived with it (pipelined replies were lost)."""
    a, b = socket.socketpair()
    try:
        a.sendall(b"".join(encode({"n": i}) for i in range(3)))
        assert [recv(b)[0]["n"] for _ in range(3)] == [0, 1, 2]
    finally:
        a.close()
        b.close()
