"""`kvpool certs`: a self-signed CA and the certificates of a test cluster (logic in kvpool/certs.py)."""

from __future__ import annotations

import argparse
import json
import sys

EPILOG = """\
examples:
  kvpool certs cluster --out ./tls --host 10.0.0.5 --tenant acme   # CA, server, admin and client-acme in one go
  kvpool certs ca --out ./tls                                        # ./tls/ca.pem, ./tls/ca.key
  kvpool certs server node-1 --ca-dir ./tls --host node-1.internal --host 10.0.0.7
  kvpool certs client engine-a --ca-dir ./tls --role client --tenant acme
  kvpool certs client alice --ca-dir ./tls --role admin --days 30

Server certificates (master and nodes; subject OU=node) are valid for 127.0.0.1, localhost and every --host, and
for both server and client authentication (nodes and the master call each other). Client certificates carry
OU=<role> and, for --role client, O=<tenant>: with `cert_roles` on, the master takes the caller's identity from
them. Keys are written 0600; existing files are kept unless --force.
exit codes: 0 written, 2 bad argument (nothing written)."""


def register(sub) -> None:
    p = sub.add_parser("certs", help="generate a CA and TLS certificates for a test cluster",
                       description="Generate a self-signed CA, server certificates and client certificates (ECDSA "
                                   "P-256, PEM) with the `cryptography` package.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION")

    def common(q, *, ca: bool) -> None:
        if ca:
            q.add_argument("--ca-dir", required=True, help="directory holding ca.pem and ca.key")
            q.add_argument("--out", default="", help="where to write (default: --ca-dir)")
        else:
            q.add_argument("--out", required=True, help="directory to write into (created if missing)")
        q.add_argument("--days", type=float, default=None, help="validity in days (CA 3650, others 365)")
        q.add_argument("--backdate-days", type=float, default=0.0,
                       help="start the validity this many days ago (with a short --days: an expired certificate "
                            "for tests)")
        q.add_argument("--force", action="store_true", help="overwrite existing files")
        q.add_argument("--json", action="store_true", help='print {"written": [paths]}')

    q = actions.add_parser("ca", help="a self-signed CA (ca.pem, ca.key)")
    common(q, ca=False)
    q.add_argument("--name", default="kvpool-ca", help="the CA's common name")
    q.set_defaults(func=run_ca)

    q = actions.add_parser("server", help="a server certificate (master or node) signed by the CA")
    q.add_argument("name", help="common name and file name (NAME.pem, NAME.key)")
    common(q, ca=True)
    q.add_argument("--host", action="append", default=[], help="DNS name or IP the server is dialled at (repeat)")
    q.set_defaults(func=run_server)

    q = actions.add_parser("client", help="a client certificate carrying a role (and tenant)")
    q.add_argument("name", help="common name and file name (NAME.pem, NAME.key)")
    common(q, ca=True)
    q.add_argument("--role", required=True, choices=("client", "admin", "node"))
    q.add_argument("--tenant", default="", help="the tenant of a --role client certificate")
    q.set_defaults(func=run_client)

    q = actions.add_parser("cluster", help="CA + server + admin (+ client-TENANT per --tenant) in one directory")
    common(q, ca=False)
    q.add_argument("--host", action="append", default=[], help="DNS name or IP of a server (repeat)")
    q.add_argument("--tenant", action="append", default=[], help="write client-TENANT.pem/.key (repeat)")
    q.set_defaults(func=run_cluster)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _done(args, issued: list) -> int:
    paths = [str(path) for i in issued for path in (i.cert_path, i.key_path)]
    if args.json:
        print(json.dumps({"written": paths}))
    else:
        print("\n".join(f"wrote {p}" for p in paths))
    return 0


def _days(args, default: float) -> float:
    return default if args.days is None else args.days  # --days 0 is an error for certs.py to name, not a default


def _guard(fn):
    def run(args) -> int:
        try:
            return fn(args)
        except ValueError as exc:
            print(f"kvpool certs {args.action}: {exc}", file=sys.stderr)
            return 2
    return run


@_guard
def run_ca(args) -> int:
    from kvpool import certs

    ca = certs.make_ca(args.name, days=_days(args, 3650), backdate_days=args.backdate_days)
    return _done(args, [certs.save(ca, args.out, "ca", force=args.force)])


def _leaf(args, **kw) -> int:
    from kvpool import certs

    ca = certs.load_ca(args.ca_dir)
    leaf = certs.issue(ca, args.name, days=_days(args, 365), backdate_days=args.backdate_days, **kw)
    return _done(args, [certs.save(leaf, args.out or args.ca_dir, args.name, force=args.force)])


@_guard
def run_server(args) -> int:
    return _leaf(args, kind="server", hosts=args.host)


@_guard
def run_client(args) -> int:
    return _leaf(args, kind="client", role=args.role, tenant=args.tenant)


@_guard
def run_cluster(args) -> int:
    from kvpool import certs

    days = _days(args, 365)
    ca = certs.make_ca(days=_days(args, 3650), backdate_days=args.backdate_days)
    leaves = [("ca", ca),
              ("server", certs.issue(ca, "server", hosts=args.host, days=days, backdate_days=args.backdate_days)),
              ("admin", certs.issue(ca, "admin", kind="client", role="admin", days=days,
                                    backdate_days=args.backdate_days))]
    leaves += [(f"client-{t}", certs.issue(ca, f"client-{t}", kind="client", role="client", tenant=t, days=days,
                                           backdate_days=args.backdate_days)) for t in args.tenant]
    written = certs.save_many(leaves, args.out, force=args.force)  # all issued and checked before any write
    return _done(args, written)
