"""store/auth config, sources and TokenStore: field-named errors, constant-time matching, rotation without restart.

Rotation is driven by an injected monotonic clock (the stat interval) and real files; nothing sleeps."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from kvpool.store.auth import AuthConfig, Identity, Role, TokenSource, TokenStore
from kvpool.store.auth import config as config_mod

NODE_A = "node-token-aaaaaaaaaaaa"
NODE_B = "node-token-bbbbbbbbbbbb"
ADMIN = "admin-token-0123456789"
ACME = "acme-token-0123456789ab"
OTHER = "other-token-0123456789a"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def write(path, text):
    """Atomic replace, as the docs ask operators to do (and as a Kubernetes Secret volume does)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@pytest.fixture
def files(tmp_path):
    paths = {name: tmp_path / f"{name}.tokens" for name in ("node", "admin", "client")}
    write(paths["node"], f"# node tokens\n{NODE_A}\n")
    write(paths["admin"], ADMIN)
    write(paths["client"], f"acme:{ACME}\nother:{OTHER}\n")
    return paths


def config(files, **kw):
    return AuthConfig(node_tokens=(f"file:{files['node']}",), admin_tokens=(f"file:{files['admin']}",),
                      client_tokens=(f"file:{files['client']}",), **kw)


def test_tokens_map_to_exactly_their_identity(files):
    store = TokenStore(config(files))
    assert store.identify(NODE_A) == Identity(Role.NODE, "", "node_tokens[0]")
    assert store.identify(ADMIN) == Identity(Role.ADMIN, "", "admin_tokens[0]")
    assert store.identify(ACME) == Identity(Role.CLIENT, "acme", "client_tokens[0]")
    assert store.identify(OTHER).tenant == "other"
    assert store.identify(f"acme:{ACME}") is None      # the tenant prefix is file syntax, not part of the token
    assert store.identify(ACME[:-1]) is None
    assert store.identify("") is None
    assert len(store) == 4


def test_env_sources_and_lists_from_one_env_string(monkeypatch, tmp_path):
    env = {"KV_NODE": f"{NODE_A} {NODE_B}", "KV_CLIENTS": f"acme:{ACME},other:{OTHER}"}
    cfg = AuthConfig(node_tokens="env:KV_NODE", client_tokens="env:KV_CLIENTS", validate_sources=False)
    assert cfg.node_tokens == ("env:KV_NODE",) and cfg.enabled
    store = TokenStore(cfg, env=env)
    assert store.identify(NODE_B).role is Role.NODE and store.identify(OTHER).tenant == "other"
    assert not AuthConfig().enabled and AuthConfig(cert_roles=True).enabled


@pytest.mark.parametrize("kwargs, message", [
    ({"node_tokens": ("s3cret-literal-token-xyz",)}, "node_tokens[0]: expected file:PATH or env:NAME"),
    ({"admin_tokens": ("file:",)}, "admin_tokens[0]: expected file:PATH or env:NAME"),
    ({"admin_tokens": ("env:NO-DASHES",)}, "admin_tokens[0]: expected file:PATH or env:NAME"),
    ({"client_tokens": 7}, "client_tokens: expected a list"),
    ({"node_tokens": ("file:/nonexistent/kv.tokens",)}, "node_tokens[0]: file /nonexistent/kv.tokens not found"),
    ({"node_tokens": ("env:KVPOOL_TEST_UNSET_VAR",)}, "node_tokens[0]: environment variable KVPOOL_TEST_UNSET_VAR"),
    ({"reload_interval_s": -1}, "reload_interval_s: expected seconds in [0, 3600]"),
    ({"cert_roles": "yes"}, "cert_roles: expected true or false"),
])
def test_config_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError) as err:
        AuthConfig(**kwargs)
    assert str(err.value).startswith(message)
    assert "s3cret" not in str(err.value)  # a literal that may be a secret is never echoed


@pytest.mark.parametrize("node, client, message", [
    ("short", f"acme:{ACME}", "node_tokens[0] ("),
    (f"{NODE_A}\n", f"{ACME}", "client_tokens[0] ("),                         # no TENANT:
    (f"{NODE_A}\n", f"acme:{ACME} :{OTHER}", "client_tokens[0] ("),           # empty tenant
    (f"{NODE_A}\n", f"acme:{ACME} other:{NODE_A}", "client_tokens[0]: a token of"),  # one token, two roles
    (f"{NODE_A}\n", f"acme:{ACME} other:{ACME}", "client_tokens[0]: a token of"),    # one token, two tenants
    ("# only a comment\n", f"acme:{ACME}", "node_tokens[0]: file:"),         # holds no token
    ("bad token with spaces\u00e9", f"acme:{ACME}", "node_tokens[0]: "),
])
def test_bad_token_files_name_the_field_and_entry(files, node, client, message):
    write(files["node"], node)
    write(files["client"], client)
    with pytest.raises(ValueError) as err:
        config(files)
    assert str(err.value).startswith(message), str(err.value)
    for secret in (NODE_A, ACME):
        assert secret not in str(err.value)


def test_lookup_is_one_keyed_hash_whatever_the_table_size(files, monkeypatch):
    small = TokenStore(config(files))
    write(files["client"], "\n".join([f"acme:{ACME}"] + [f"t{i}:tenant-token-{i:010d}" for i in range(1000)]))
    big = TokenStore(config(files))
    assert (len(small), len(big)) == (4, 1003)
    calls = []
    real = config_mod.hashlib.blake2b

    class Counting:
        @staticmethod
        def blake2b(data, **kw):
            calls.append(data)
            return real(data, **kw)

        sha256 = staticmethod(hashlib.sha256)

    monkeypatch.setattr(config_mod, "hashlib", Counting)
    for store in (small, big):
        for token in (NODE_A, ACME, "not-a-token-at-all-x"):
            calls.clear()
            store.identify(token)
            assert calls == [token.encode()]  # one keyed hash, no per-entry work
    assert big.identify("tenant-token-0000000999") == Identity(Role.CLIENT, "t999", "client_tokens[0]")
    # the table holds neither tokens nor their plain SHA-256, and each store has its own key
    plain = {hashlib.sha256(t.encode()).digest() for t in (NODE_A, ADMIN, ACME)}
    assert not plain & set(small._table) and not set(small._table) & set(big._table)  # noqa: SLF001


def test_rotation_takes_effect_at_the_first_check_after_the_file_changes(files):
    clock = Clock()
    store = TokenStore(config(files, reload_interval_s=0.5), clock=clock)
    assert store.identify(NODE_A).role is Role.NODE and store.identify(NODE_B) is None
    write(files["node"], f"{NODE_A}\n{NODE_B}\n")      # step 1: old + new
    clock.now += 0.49
    assert store.identify(NODE_B) is None and store.version == 1  # not due: no stat, old table
    clock.now += 0.01
    assert store.identify(NODE_B).role is Role.NODE and store.version == 2
    assert store.identify(NODE_A).role is Role.NODE
    write(files["node"], f"{NODE_B}\n")                 # step 2: old removed
    clock.now += 0.5
    assert store.identify(NODE_A) is None and store.identify(NODE_B).role is Role.NODE and store.version == 3
    clock.now += 0.5
    assert store.identify(NODE_B).role is Role.NODE and store.version == 3  # unchanged file: no reload


def test_same_size_rewrite_within_one_mtime_tick_is_seen(files):
    # Kernel file times are coarse; a same-size rewrite can keep size and mtime. The racy-clean re-read sees it.
    clock = Clock()
    store = TokenStore(config(files, reload_interval_s=0), clock=clock)
    st = os.stat(files["admin"])
    new = "admin-token-9876543210"
    assert len(new) == len(ADMIN)
    with open(files["admin"], "w") as f:   # in place: same inode, same size
        f.write(new)
    os.utime(files["admin"], ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime
    assert store.identify(new).role is Role.ADMIN and store.identify(ADMIN) is None


def test_a_broken_rotation_keeps_the_previous_table(files, caplog):
    clock = Clock()
    store = TokenStore(config(files, reload_interval_s=0), clock=clock)
    write(files["client"], f"acme:{ACME}\nbroken-entry-without-tenant-x\n")
    assert store.identify(ACME).tenant == "acme" and store.identify(OTHER).tenant == "other"
    assert store.version == 1 and "token reload failed" in caplog.text
    os.unlink(files["admin"])
    assert store.identify(ADMIN).role is Role.ADMIN
    write(files["admin"], NODE_B.replace("node", "admn"))
    write(files["client"], f"acme:{ACME}\n")
    assert store.identify(ADMIN) is None and store.identify(OTHER) is None and store.version == 2
    with pytest.raises(ValueError, match="node_tokens"):  # a TokenStore never starts on a bad table
        write(files["node"], "")
        TokenStore(config(files, validate_sources=False))


def test_token_source_presents_the_first_entry_and_follows_the_file(tmp_path):
    path = tmp_path / "client.token"
    write(path, f"acme:{ACME}\nacme:{OTHER}\n")
    clock = Clock()
    src = TokenSource(f"file:{path}", field="auth_token", reload_interval_s=1.0, clock=clock)
    assert src.token() == ACME
    write(path, f"{NODE_B}\n")
    assert src.token() == ACME
    clock.now += 1.0
    assert src.token() == NODE_B
    write(path, "")
    clock.now += 1.0
    assert src.token() == NODE_B  # an empty file during a botched rotation keeps the last good token
    with pytest.raises(ValueError, match=r"^auth_token: file:.* holds no token"):
        TokenSource(f"file:{path}", field="auth_token")
    with pytest.raises(ValueError, match=r"^auth_token: expected file:PATH or env:NAME"):
        TokenSource(ACME, field="auth_token")
    assert TokenSource("env:T", env={"T": ADMIN}).token() == ADMIN


class Gate:
    """Wraps a loader so that its next call signals `entered` and blocks until `go`: a reload another thread is in
    the middle of, frozen there."""

    def __init__(self, real):
        self.real = real
        self.entered = threading.Event()
        self.go = threading.Event()
        self.armed = False

    def __call__(self, *args, **kwargs):
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.go.wait(30)
        return self.real(*args, **kwargs)


def _race(first, second, gate):
    """`first` runs into the gated reload; `second` runs while that reload is frozen. Returns both results. A second
    call that does not wait for the reload returns at once (the stale answer); one that waits is still blocked."""
    results = {}
    a = threading.Thread(target=lambda: results.__setitem__("first", first()))
    b = threading.Thread(target=lambda: results.__setitem__("second", second()))
    gate.armed = True
    a.start()
    assert gate.entered.wait(30)
    b.start()
    b.join(2.0)         # without the wait, the second call answers well within this from the table it has
    waited = b.is_alive()
    gate.go.set()
    a.join(30)
    b.join(30)
    return results, waited


def test_a_new_token_is_not_refused_while_another_call_is_reloading_the_table(files, monkeypatch):
    """Rotation races: a call whose token was added to its file just before it must not be refused because another
    call holds the reload lock at that moment (found in CI: a rotated client token refused UNAUTHENTICATED)."""
    from kvpool.store.auth import table as table_mod

    store = TokenStore(config(files, reload_interval_s=0))
    gate = Gate(table_mod.load_entries)
    monkeypatch.setattr(table_mod, "load_entries", gate)
    write(files["client"], f"acme:{ACME}\nacme:{NODE_B}\n")     # a second acme token, added by rotation
    results, waited = _race(lambda: store.identify(NODE_B), lambda: store.identify(NODE_B), gate)
    assert results == {"first": Identity(Role.CLIENT, "acme", "client_tokens[0]"),
                       "second": Identity(Role.CLIENT, "acme", "client_tokens[0]")}
    assert waited and store.version == 2
    gate.armed = False
    assert store.identify(ACME).tenant == "acme" and store.identify(OTHER) is None


def test_a_known_token_does_not_wait_for_a_reload_in_progress(files, monkeypatch):
    from kvpool.store.auth import table as table_mod

    store = TokenStore(config(files, reload_interval_s=0))
    gate = Gate(table_mod.load_entries)
    monkeypatch.setattr(table_mod, "load_entries", gate)
    write(files["client"], f"acme:{ACME}\n")
    results, waited = _race(lambda: store.identify(OTHER), lambda: store.identify(ACME), gate)
    assert not waited       # ACME is in the current table: answered from it while the reload is frozen
    assert results == {"first": None, "second": Identity(Role.CLIENT, "acme", "client_tokens[0]")}


def test_a_token_source_never_presents_the_token_a_reload_in_progress_is_replacing(tmp_path, monkeypatch):
    from kvpool.store.auth import client as client_mod

    path = tmp_path / "client.token"
    write(path, f"{ACME}\n")
    src = TokenSource(f"file:{path}", reload_interval_s=0)
    gate = Gate(client_mod.read_source)
    monkeypatch.setattr(client_mod, "read_source", gate)
    write(path, f"{NODE_B}\n")                    # rotated: the old token is about to be revoked at the master
    results, waited = _race(src.token, src.token, gate)
    assert results == {"first": NODE_B, "second": NODE_B} and waited
