"""Where PostgreSQL's time goes under `engram bench load`, per statement, for one or more source trees in turns.

    python scripts/pg_statements_load.py --seconds 40 --clients 50 /path/to/main /path/to/branch

Each tree gets a fresh `engram serve` (that tree on `PYTHONPATH`) whose embedded PostgreSQL loads
pg_stat_statements with planning times (`ENGRAM_EMBEDDED_PG_STATEMENTS`, so a tree must have that setting); the
statistics are reset once the service is up, the load runs, and the run's figures are printed with the
statements that took most of PostgreSQL's time (execution and planning, in ms, and per call), and the calls and
time of the statements whose text starts with each ``--watch`` prefix.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import psycopg

SHOWN = ("requests_per_s", "api_cpu_s_per_1000", "postgresql_cpu_s_per_1000", "search_p95_ms", "lost_writes")

_TOP = """
SELECT calls, total_exec_time, total_plan_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 110)
FROM pg_stat_statements WHERE calls > 0 ORDER BY total_exec_time + total_plan_time DESC LIMIT %s
"""
# Rows written per table, and how many updates were HOT (no index entry written: the new version fits the page).
_TABLES = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables
WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY n_tup_ins + n_tup_upd + n_tup_del DESC LIMIT 8
"""
_WATCHED = """
SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time + total_plan_time), 0)
FROM pg_stat_statements WHERE starts_with(regexp_replace(query, '\\s+', ' ', 'g'), %s)
"""
_TOTAL = "SELECT coalesce(sum(total_exec_time), 0), coalesce(sum(total_plan_time), 0) FROM pg_stat_statements"


def _owner_url(home: Path) -> str:
    """The served home's database, as its owner (pg_stat_statements shows every role's statements to it)."""
    from core.config import reset_settings_cache
    from core.db import owner_database_url

    os.environ["ENGRAM_HOME"] = str(home)
    os.environ.pop("ENGRAM_DATABASE_URL", None)
    reset_settings_cache()
    return owner_database_url().replace("postgresql+psycopg://", "postgresql://")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", help="source trees, in the order to run them")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--tenants", type=int, default=1, help="clients spread over this many tenants")
    parser.add_argument("--replicas", type=int, default=1, help="API replicas in all, each tenant sent to one")
    parser.add_argument("--top", type=int, default=15, help="how many statements to list")
    parser.add_argument("--watch", action="append", default=[], help="a statement's opening text to count")
    parser.add_argument("--tables", action="store_true", help="rows written per table (HOT updates apart)")
    args = parser.parse_args()
    from api.bench.load import figures_of, throwaway_serve

    for tree in args.trees:
        os.environ["PYTHONPATH"] = str(Path(tree).resolve())  # the serve's tree (its children inherit it)
        settings = {"ENGRAM_EMBEDDED_PG_STATEMENTS": "true"}
        log = lambda message: print(message, file=sys.stderr)  # noqa: E731
        with throwaway_serve(log=log, env=settings) as served, served.more_replicas(args.replicas - 1, log=log) as more:
            keys = served.tenant_keys(args.tenants)
            url = _owner_url(served.home)
            with psycopg.connect(url, autocommit=True) as connection:
                connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                connection.execute("SELECT pg_stat_statements_reset()")
                connection.execute("SELECT pg_stat_reset()")
            figures = figures_of(
                [served.url, *more], keys, clients=args.clients, seconds=args.seconds, log=lambda _: None,
                root=served.pid,
            )  # fmt: skip
            with psycopg.connect(url, autocommit=True) as connection:
                executing, planning = connection.execute(_TOTAL).fetchone() or (0.0, 0.0)
                top = connection.execute(_TOP, (args.top,)).fetchall()
                watched = [
                    (prefix, connection.execute(_WATCHED, (prefix,)).fetchone() or (0, 0.0)) for prefix in args.watch
                ]
                tables = connection.execute(_TABLES).fetchall() if args.tables else []
        shown = " ".join(f"{f['metric']}={f['value']:g}" for f in figures if f["metric"] in SHOWN)
        print(f"{Path(tree).name} {shown} statements_ms={executing:.0f} planning_ms={planning:.0f}", flush=True)
        for prefix, (calls, ms) in watched:
            print(f"  watched {prefix!r}: calls={calls} ms={ms:.0f}")
        for name, inserted, updated, hot, deleted in tables:
            print(f"  table {name}: inserted={inserted} updated={updated} (hot {hot}) deleted={deleted}")
        for calls, exec_ms, plan_ms, text in top:
            per_call = exec_ms / calls
            print(f"  {exec_ms:8.0f} ms exec {plan_ms:6.0f} ms plan {calls:7d} calls {per_call:7.3f} ms/call  {text}")


if __name__ == "__main__":
    main()
