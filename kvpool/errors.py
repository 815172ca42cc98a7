"""Errors raised by the pool client. Caller mistakes are ValueError; remote faults are PoolError subclasses,
which the connector turns into misses (recompute), never into a failed request."""


class PoolError(Exception):
    """Base of every pool-side fault seen by a client."""


class PoolUnavailable(PoolError):
    """Master or node unreachable (connection refused, DNS, health check failing)."""


class PoolTimeout(PoolError):
    """A call did not answer within its deadline after the configured retries."""


class PoolDataError(PoolError):
    """Bytes failed verification (checksum / header mismatch); treated as a miss."""


class PoolProtocolError(PoolError):
    """The server answered something this client does not understand (version skew)."""


class PoolNotFound(PoolError):
    """The master does not hold the named node or object (gRPC NOT_FOUND)."""


class PoolAuthError(PoolError):
    """The master refused the credential (gRPC UNAUTHENTICATED: none or unknown) or its role (PERMISSION_DENIED)."""
