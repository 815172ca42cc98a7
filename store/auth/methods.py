"""Which role may call which RPC: the one table the interceptor enforces. Every RPC served by kvpool is listed;
a method missing from the table is refused (tests/store/test_auth.py checks the table against the descriptors).

PUBLIC: no credential is read. Only the standard health service: it says SERVING or not, nothing about the
pool, and load balancers and Kubernetes gRPC probes cannot send a token.

GRANT: the bulk-data RPCs of a node (NodeService Write / Read). The request itself carries an HMAC write grant or
read lease signed by the master for exactly that extent and expiry (store/tokens.py), checked by the handler as the
TCP data channel checks it. A bearer credential adds nothing there, and demanding one would mean handing every
tenant's token to every node (a node compromise would then leak every tenant's identity).

Otherwise a set of roles. The master also calls a node's Demote / Promote / Drop: it presents a NODE token (the
master and the nodes share the cluster's node tokens).
"""

from __future__ import annotations

import enum
from typing import Mapping, Union

from kvpool.store.auth.config import Role


class Access(enum.Enum):
    PUBLIC = "public"
    GRANT = "grant"


PUBLIC = Access.PUBLIC
GRANT = Access.GRANT
Rule = Union[Access, frozenset]

NODE = frozenset({Role.NODE})
CLIENT = frozenset({Role.CLIENT})
ADMIN = frozenset({Role.ADMIN})
CLIENT_OR_ADMIN = frozenset({Role.CLIENT, Role.ADMIN})
STATS = frozenset({Role.CLIENT, Role.ADMIN, Role.VIEWER})

_MASTER = {
    "RegisterNode": NODE,       # hands back the secret that signs every grant: nodes only
    "Heartbeat": NODE,
    "ReportObjects": NODE,
    "DrainNode": ADMIN,
    "FlushNode": NODE,          # a node stopping cleanly asks for its DRAM to be written to its SSD
    "PutStart": CLIENT,
    "PutCommit": CLIENT,
    "PutAbort": CLIENT,
    "Lookup": CLIENT,
    "Release": CLIENT,
    "Contains": CLIENT,
    "Remove": CLIENT_OR_ADMIN,  # a client within its tenant; an admin anywhere (`kvpool rm`)
    "List": ADMIN,
    "Inspect": ADMIN,
    "Evict": ADMIN,
    "Stats": STATS,             # a client gets its own tenant's figures; admin and viewer the pool's
    "BeginDrain": ADMIN,        # drain with moves is driven by `kvpool drain` (an admin credential)
    "MigrateStart": ADMIN,
    "MigrateCommit": ADMIN,
    "MigrateAbort": ADMIN,
    "StartRecording": ADMIN,    # writes files on the master's host (`kvpool trace record`)
    "StopRecording": ADMIN,
    "Hello": STATS,             # where the control channel listens: any role that may call the master
}
_NODE = {"Write": GRANT, "Read": GRANT, "Demote": NODE, "Promote": NODE, "Drop": NODE, "Publish": NODE}
_HEALTH = {"Check": PUBLIC, "Watch": PUBLIC, "List": PUBLIC}

METHOD_RULES: Mapping[str, Rule] = {
    **{f"/kvpool.v1.MasterService/{m}": r for m, r in _MASTER.items()},
    **{f"/kvpool.v1.NodeService/{m}": r for m, r in _NODE.items()},
    **{f"/grpc.health.v1.Health/{m}": r for m, r in _HEALTH.items()},
}
