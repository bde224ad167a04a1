"""`engram demo`: the README's example shop, so a newcomer's first session has data to talk about.

It makes a small SQLite shop database, registers it as datasource ``shop``, ingests it (and waits for the
follow-up jobs), and saves a few memories about it under fixed ids (``demo-...``), so running it twice
changes nothing and the integer ids the quickstart's own saves get are the ones the README shows.
"""

# Imports inside the commands are deferred: `engram` loads only the command that runs (see api.cli).
from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from engram_client import EngramError

from api.cli.ops import _http, with_connection

DEFAULT_DB = Path(tempfile.gettempdir()) / "engram-demo" / "shop.db"

_SCHEMA = """
CREATE TABLE regions (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, region_id INTEGER REFERENCES regions(id));
CREATE TABLE orders (
    id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), amount INTEGER NOT NULL,
    status TEXT NOT NULL, created_at TEXT NOT NULL
);
CREATE TABLE orders_archive (
    id INTEGER PRIMARY KEY, customer_id INTEGER, amount INTEGER NOT NULL, status TEXT NOT NULL, archived_at TEXT
);
"""
_REGIONS = ["north", "south", "east", "west"]
_STATUSES = ["paid", "paid", "paid", "refunded", "cancelled"]

MEMORIES: list[dict[str, Any]] = [
    {
        "id": "demo-refunds",
        "content": "refunded orders keep their amount; exclude status 'refunded' from revenue",
        "kind": "decision",
        "linked_entities": ["shop.orders.status", "shop.orders.amount"],
    },
    {
        "id": "demo-archive",
        "content": "orders_archive holds orders older than two years; union it for multi-year trends",
        "kind": "knowledge",
        "linked_entities": ["shop.orders_archive", "shop.orders"],
    },
    {
        "id": "demo-regions",
        "content": "sales by region join orders -> customers -> regions",
        "kind": "fact",
        "linked_entities": ["shop.customers.region_id", "shop.regions.name"],
    },
]


def make_shop_database(path: Path) -> None:
    """(Re)create the example shop: 4 regions, 40 customers, 300 orders and 100 archived ones."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as connection:
        connection.executescript(_SCHEMA)
        connection.executemany("INSERT INTO regions VALUES (?, ?)", list(enumerate(_REGIONS, start=1)))
        connection.executemany(
            "INSERT INTO customers VALUES (?, ?, ?)",
            [(i, f"customer {i}", i % len(_REGIONS) + 1) for i in range(1, 41)],
        )
        connection.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
            [
                (i, i % 40 + 1, 500 + (i * 37) % 9500, _STATUSES[i % len(_STATUSES)], f"2026-{i % 12 + 1:02d}-15")
                for i in range(1, 301)
            ],
        )
        connection.executemany(
            "INSERT INTO orders_archive VALUES (?, ?, ?, ?, ?)",
            [(i, i % 40 + 1, 400 + (i * 53) % 8000, "paid", "2024-01-01") for i in range(1, 101)],
        )
    connection.close()


def _wait(client: Any, job_id: str, *, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = client.request("GET", f"/v1/jobs/{job_id}")
        if job["state"] in ("succeeded", "failed") or time.monotonic() > deadline:
            return job
        time.sleep(0.3)


@click.command("demo")
@click.option(
    "--db", "db_path", type=click.Path(dir_okay=False), default=str(DEFAULT_DB), show_default=True,
    help="where to write the example shop database",
)  # fmt: skip
@with_connection
def demo(db_path: str, url: str | None, api_key: str | None) -> None:
    """Create the example shop database, register and ingest it as datasource `shop`, and save a few
    memories about it (admin key)."""
    path = Path(db_path).expanduser().resolve()
    make_shop_database(path)
    click.echo(f"shop database: {path} (regions, customers, orders, orders_archive)")
    client = _http(url, api_key)
    try:
        try:
            client.request("POST", "/v1/datasources", json={"name": "shop", "url": f"sqlite:///{path}"})
        except EngramError as exc:
            if exc.status != 409:  # already registered: ingest it again, which follows the file
                raise
        job = _wait(client, client.request("POST", "/v1/datasources/shop/ingest", json={})["job_id"])
        for follow_id in (job.get("result") or {}).get("follow_up_jobs", {}).values():
            _wait(client, follow_id)
        if job["state"] != "succeeded":
            raise click.ClickException(f"ingest of shop failed: {job['error']}")
        models = client.request("GET", "/v1/datasources/shop")["models"]
        click.echo(f"datasource shop: ingested ({len(models)} models: {', '.join(models)})")
        for body in MEMORIES:
            client.request("POST", "/v1/memories", json=body)
        click.echo(f"memories: {', '.join(m['id'] for m in MEMORIES)}")
    except EngramError as exc:
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(1)
    finally:
        client.close()
