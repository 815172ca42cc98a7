"""store/sockets.py's kernel_timeouts: blocking sockets whose timeout the kernel keeps, on real socket pairs."""

from __future__ import annotations

import socket
import struct

import pytest

from kvpool.store.sockets import kernel_timeouts

TIMEVAL = struct.Struct("@ll")


def timeouts(sock):
    """(SO_RCVTIMEO, SO_SNDTIMEO) in microseconds, as the kernel reads them back (rounded up to its clock tick)."""
    out = []
    for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sec, usec = TIMEVAL.unpack(sock.getsockopt(socket.SOL_SOCKET, opt, TIMEVAL.size))
        out.append(sec * 1_000_000 + usec)
    return out


@pytest.mark.parametrize(("seconds", "micros"), [(0.25, 250_000), (60.0, 60_000_000), (1.9999999, 2_000_000),
                                                 (1e-9, 1)])
def test_the_kernel_keeps_the_timeout_and_the_socket_is_blocking(seconds, micros):
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(5.0)
        kernel_timeouts(a, seconds)
        assert a.gettimeout() is None            # blocking: no poll before each call
        for got in timeouts(a):                  # the kernel rounds up to its tick (4 ms at HZ=250): never to 0 = "never"
            assert micros <= got <= micros + 10_000, (seconds, got)


def test_a_silent_peer_makes_a_receive_fail_with_blocking_io_error():
    a, b = socket.socketpair()
    with a, b:
        kernel_timeouts(a, 0.2)
        with pytest.raises(BlockingIOError):
            a.recv_into(bytearray(8))
        b.sendall(b"abcd")                      # the socket is still usable after a timeout
        assert a.recv(4) == b"abcd"


def test_none_means_blocking_without_a_timeout():
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(5.0)
        kernel_timeouts(a, None)
        assert a.gettimeout() is None and timeouts(a) == [0, 0]
