"""Authentication and authorisation of kvpool's RPCs: node, client (one tenant) and admin credentials.

    config.py   Role, Identity, AuthConfig (token sources per role), token file format
    sources.py  file:PATH / env:NAME secret sources; SourceWatch (cheap change detection for rotation)
    table.py    TokenStore: accepted tokens as keyed digests, one O(1) timing-safe lookup, reload on change
    methods.py  METHOD_RULES: which role may call each RPC (PUBLIC health, GRANT data RPCs)
    server.py   AuthInterceptor (gRPC server interceptor) and current_identity()
    client.py   TokenSource, BearerInterceptor, auth_channel()

TLS lives next door in store/tls.py; certificates for a test cluster come from kvpool/certs.py (`kvpool certs`).
"""

from kvpool.store.auth.client import BearerInterceptor, TokenSource, auth_channel, bearer_metadata
from kvpool.store.auth.config import AuthConfig, Identity, Role
from kvpool.store.auth.methods import GRANT, METHOD_RULES, PUBLIC
from kvpool.store.auth.server import AuthInterceptor, current_identity, identity_from_cert, role_refusal, serving_as
from kvpool.store.auth.table import TokenStore

__all__ = ["AuthConfig", "AuthInterceptor", "BearerInterceptor", "GRANT", "Identity", "METHOD_RULES", "PUBLIC",
           "Role", "TokenSource", "TokenStore", "auth_channel", "bearer_metadata", "current_identity",
           "identity_from_cert", "role_refusal", "serving_as"]
