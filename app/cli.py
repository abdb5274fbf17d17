"""The ``berth`` command line: serve | reconcile | migrate | keys | tenants | bench | openapi.

Each subcommand imports its implementation lazily so that ``berth --help`` stays fast and a
missing optional piece never breaks the others. Bad configuration ends with one line on
stderr that says what to fix, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from app.errors import ConfigurationError


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run the API (and, unless disabled, a reconciler)",
        description="Run the HTTP API and, unless BERTH_RECONCILER_ENABLED=false, a "
        "reconciler in the same process. Without BERTH_DATABASE_URL, the embedded PostgreSQL "
        "in the data directory is started and migrated first.",
    )
    p.add_argument("--host", help="listen address (default BERTH_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default BERTH_PORT or 8000)")
    _data_dir(p, "created (and migrated) when it holds no database yet")


def _data_dir(parser: argparse.ArgumentParser, when_missing: str) -> None:
    parser.add_argument(
        "--data-dir",
        help=f"directory of the embedded PostgreSQL, used without BERTH_DATABASE_URL (default "
        f"BERTH_DATA_DIR, else ./.berth); {when_missing}",
    )


#: What keys and reconcile do with a data directory that holds no database.
_REFUSED = "refused with an error when it holds no database yet"


def _add_reconcile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reconcile",
        help="run a reconciler alone",
        description="Run a reconciler alone, to scale reconcilers apart from the API.",
    )
    p.add_argument(
        "--shard", help="static shard ownership INDEX/COUNT (default: dynamic, advisory locks)"
    )
    _data_dir(p, _REFUSED)


def _add_migrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "migrate",
        help="upgrade the database schema to head",
        description="Upgrade BERTH_DATABASE_URL (or the embedded database) to the newest "
        "schema and print the revision it is at.",
    )
    _data_dir(p, "created (and said so) when it holds no database yet")


def _add_keys(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="manage API keys", description="Manage API keys.")
    ksub = p.add_subparsers(dest="keys_command", required=True)
    c = ksub.add_parser(
        "create",
        help="create an API key; prints the key alone on its last line",
        description="Create an API key and print it alone on the last line. Tenant keys need "
        "at least one --tenant, runtime keys at least one --runtime-instance.",
    )
    c.add_argument(
        "--role",
        required=True,
        choices=["admin", "operator", "tenant", "runtime"],
        help="what the key may do",
    )
    c.add_argument("--subject", required=True, help="who the key belongs to")
    c.add_argument("--tenant", action="append", default=[], help="tenant id (repeatable)")
    c.add_argument(
        "--runtime-instance", action="append", default=[], help="runtime instance id (repeatable)"
    )
    _data_dir(c, _REFUSED)
    ls = ksub.add_parser(
        "list",
        help="list API keys (never their secrets)",
        description="List API keys oldest first: id, prefix, role, subject, scope, creation, "
        "last use (recorded at most once a minute) and revocation.",
    )
    ls.add_argument("--active", action="store_true", help="leave out revoked keys")
    _data_dir(ls, _REFUSED)
    r = ksub.add_parser(
        "revoke",
        help="revoke an API key by id",
        description="Revoke an API key by its id (the first column of 'berth keys list'). "
        "Running servers refuse it within their key cache window (5 seconds). The last live "
        "admin key cannot be revoked.",
    )
    r.add_argument("key_id", metavar="KEY_ID", help="the key's id")
    _data_dir(r, _REFUSED)


def _add_tenants(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tenants", help="manage tenants' cohorts and quotas",
        description="Manage tenants' cohorts, fair weights and quotas.",
    )
    tsub = p.add_subparsers(dest="tenants_command", required=True)
    ls = tsub.add_parser(
        "list", help="list configured tenants",
        description="List configured tenants by id: cohort, fair weight and quotas.",
    )
    _data_dir(ls, _REFUSED)
    g = tsub.add_parser(
        "get", help="print a tenant with its usage",
        description="Print a tenant's settings and its usage per runtime class as JSON.",
    )
    g.add_argument("tenant_id", metavar="TENANT_ID", help="the tenant's id")
    _data_dir(g, _REFUSED)
    s = tsub.add_parser(
        "set", help="set a tenant's cohort, fair weight and quotas (replaces them whole)",
        description="Set a tenant's cohort, fair weight and quotas, replacing them whole, "
        "as PUT /v1/tenants/{tenantId} does. A quota is "
        "CLASS:RESOURCE=NOMINAL[:BORROWING_LIMIT[:LENDING_LIMIT]], e.g. "
        "gpu-small:cpuMillis=8000:4000; an empty limit is no limit.",
    )
    s.add_argument("tenant_id", metavar="TENANT_ID", help="the tenant's id")
    s.add_argument("--cohort", default="default", help="its cohort (default: default)")
    s.add_argument("--fair-weight", type=float, default=1.0, help="its fair weight (> 0)")
    s.add_argument("--quota", action="append", default=[], help="a quota (repeatable)")
    _data_dir(s, _REFUSED)


def _add_replay(sub: argparse._SubParsersAction) -> None:
    pr = sub.add_parser(
        "profile", help="the profile that decides placements",
        description="The plugins, weights, strategy, policy, fairness and quota settings "
        "that decide placements.",
    )
    psub = pr.add_subparsers(dest="profile_command", required=True)
    psub.add_parser("show", help="print the live profile as JSON",
                    description="Print the live profile (from the BERTH_* settings) as JSON: "
                    "the same document, changed, is a profile file for 'berth replay'.")
    p = sub.add_parser(
        "replay", help="plan recorded passes again and compare",
        description="Plan the recorded passes again with this build's planner and compare "
        "each decision with the one committed (exit 1 when one differs). With --profile, "
        "replay them under that profile instead and summarise the effect (a what-if). Each "
        "pass replays from its own recorded inputs (no cascade).",
    )
    p.add_argument("--since", help="the passes recorded in this last span, e.g. 10m "
                   "(default 10m)")
    p.add_argument("--pass", dest="pass_ids", action="append", default=[], metavar="ID",
                   help="a pass id (repeatable)")
    p.add_argument("--profile", metavar="FILE", help="a profile file ('berth profile show' "
                   "prints the live one)")
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    _data_dir(p, _REFUSED)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    # The bench package parses its own arguments, --help included.
    p = sub.add_parser(
        "bench", add_help=False,
        help="benchmarks: 'berth bench --help' lists them (see docs/benchmarks.md)",
        description="Run a benchmark of the bench package installed beside Berth.",
    )
    p.add_argument("args", nargs=argparse.REMAINDER)


def _add_openapi(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "openapi",
        help="print the OpenAPI document (no database needed)",
        description="Print the OpenAPI document of the Berth API (built without a database), "
        "or write it to a file; docs/openapi.json is its output.",
    )
    p.add_argument("--output", help="write the document to this file instead of stdout")


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of the ``berth`` command."""
    parser = argparse.ArgumentParser(
        prog="berth",
        description="Berth, a multi-tenant placement scheduler: run the API and reconcilers, "
        "migrate the database, manage API keys, run benchmarks.",
        epilog="Settings are BERTH_* environment variables (see README.md). "
        "'berth COMMAND --help' describes a command.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_serve, _add_reconcile, _add_migrate, _add_keys, _add_tenants, _add_replay,
                _add_bench, _add_openapi):
        add(sub)
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        from app.serve import serve

        return serve(host=args.host, port=args.port, data_dir=args.data_dir)
    if args.command == "reconcile":
        from app.reconciler.process import run_reconciler

        return run_reconciler(shard=args.shard, data_dir=args.data_dir)
    if args.command == "migrate":
        from app.serve import migrate

        return migrate(data_dir=args.data_dir)
    if args.command == "keys":
        from app import keys_cli

        if args.keys_command == "list":
            return keys_cli.list_keys(include_revoked=not args.active, data_dir=args.data_dir)
        if args.keys_command == "revoke":
            return keys_cli.revoke_key(key_id=args.key_id, data_dir=args.data_dir)
        return keys_cli.create_key(
            role=args.role,
            subject=args.subject,
            tenants=args.tenant,
            runtime_instances=args.runtime_instance,
            data_dir=args.data_dir,
        )
    if args.command == "tenants":
        from app import tenants_cli

        if args.tenants_command == "list":
            return tenants_cli.list_tenants(data_dir=args.data_dir)
        if args.tenants_command == "get":
            return tenants_cli.get_tenant(tenant_id=args.tenant_id, data_dir=args.data_dir)
        return tenants_cli.set_tenant(
            tenant_id=args.tenant_id, cohort=args.cohort, fair_weight=args.fair_weight,
            quotas=args.quota, data_dir=args.data_dir,
        )
    if args.command in ("profile", "replay"):
        from app import replay_cli

        if args.command == "profile":
            return replay_cli.profile_show()
        return replay_cli.replay(since=args.since, pass_ids=args.pass_ids,
                                 profile_file=args.profile, as_json=args.json,
                                 data_dir=args.data_dir)
    if args.command == "openapi":
        from app.document import openapi_write

        return openapi_write(args.output)
    if args.command == "bench":
        # Installed beside app, never imported by it at module level.
        from bench.cli import main as bench_main

        return bench_main(args.args)
    raise AssertionError(args.command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``berth`` command and return its exit status."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "bench":
        args.args = unknown + args.args
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return _run(args)
    except ConfigurationError as exc:
        print(f"berth: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        print(f"berth: bad configuration BERTH_{where.upper()}: {first['msg']}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
