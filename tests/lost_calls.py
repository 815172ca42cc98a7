"""The one fault a network can do to a master call, put into a client's gRPC stub: `OneLostCall` fails the first
call of one method UNAVAILABLE, either before it reaches the master (the request lost) or after the master ran it
(the reply lost). Used where a call is retried (tests/kvpool/test_commit_retry.py, tests/store/test_drain.py)."""

from __future__ import annotations

import grpc


class Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection reset (injected)"


class OneLostCall:
    """A client's stub (`client.rpc.stub = OneLostCall(client.rpc.stub, "PutCommit", ran)`) whose first call of
    `method` fails UNAVAILABLE: `ran` says whether the master ran it first. `calls` counts the calls of `method`."""

    def __init__(self, stub, method: str, ran: bool) -> None:
        self._stub, self._method, self._ran, self.calls = stub, method, ran, 0

    def __getattr__(self, name):
        real = getattr(self._stub, name)
        if name != self._method:
            return real

        def call(request, **kw):
            self.calls += 1
            if self.calls == 1:
                if self._ran:
                    real(request, **kw)
                raise Unavailable()
            return real(request, **kw)

        return call
