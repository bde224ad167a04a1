"""The embedded PostgreSQL and Redis behind `engram serve`: real binaries, no mocks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from api.serve import embedded
from api.serve.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    EmbeddedServiceError,
    free_port,
    pg_data_dir_for,
    shared_buffers,
)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def home() -> Iterator[Path]:
    """A home under /tmp, which the postgres system user can traverse when the suite runs as root."""
    with tempfile.TemporaryDirectory(prefix="engram-embedded-") as path:
        os.chmod(path, 0o755)
        yield Path(path)


def _throwaway_postgres(data_dir: Path) -> EmbeddedPostgres:
    """Without fsync: a test cluster need not survive a machine crash, and initdb gets twice as fast."""
    return EmbeddedPostgres(data_dir=data_dir, durable=False)


def _psycopg_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _wait_gone(pid: int, *, timeout: float = 10.0) -> bool:
    """Whether `pid` has exited (zombies count as gone: they run nothing and hold no port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert port not in (5432, 6379)
    assert 1024 < port < 65536


def test_pg_data_dir_for_never_widens_permissions(home: Path) -> None:
    """home/pg when the postgres user can reach it; as root behind a 0700 parent, a stable /var/lib dir."""
    assert pg_data_dir_for(home) == home / "pg"
    private = home / "private"
    private.mkdir(mode=0o700)
    hidden_home = private / ".engram"
    chosen = pg_data_dir_for(hidden_home)
    if os.geteuid() == 0:
        assert chosen.parent == Path("/var/lib/engram") and chosen.name.startswith("pg-")
        assert chosen == pg_data_dir_for(hidden_home)
        assert private.stat().st_mode & 0o777 == 0o700
    else:
        assert chosen == hidden_home / "pg"


def test_postgres_with_pgvector_and_redis_start_serve_and_stop(home: Path) -> None:
    postgres = EmbeddedPostgres(data_dir=pg_data_dir_for(home))
    broker = EmbeddedRedis(data_dir=home / "redis")
    try:
        url = postgres.start()
        assert url.startswith(f"postgresql+psycopg://postgres:{postgres.password}@127.0.0.1:")
        assert url.endswith("/engram") and len(postgres.password) >= 32
        assert url == postgres.url and postgres.port not in (None, 5432)
        with psycopg.connect(_psycopg_dsn(url)) as conn:
            distance = conn.execute("SELECT '[1,2,3]'::vector <=> '[1,2,4]'::vector").fetchone()
            assert distance is not None and 0 < distance[0] < 0.02
            assert conn.execute("SHOW max_connections").fetchone() == ("200",)
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
            # An eighth of the machine's memory, 128MB..2GB (a million vectors' HNSW index is ~1.7 GB).
            same = "SELECT pg_size_bytes(current_setting('shared_buffers')) = pg_size_bytes(%s)"
            assert conn.execute(same, (shared_buffers(),)).fetchone() == (True,)

        redis_url = broker.start()
        assert redis_url == f"redis://127.0.0.1:{broker.port}/0" and broker.port != 6379
        client = redis.Redis.from_url(redis_url)
        client.set("greeting", "hello")
        assert client.get("greeting") == b"hello"
        client.close()
    finally:
        postgres.stop()
        broker.stop()
    pids = [postgres.pid, broker.pid]
    postgres.stop()  # idempotent
    broker.stop()
    for pid in pids:
        assert pid is not None and not psutil.pid_exists(pid)


def _refused_without_password(postgres: EmbeddedPostgres) -> list[str]:
    """How each password-less login attempt (TCP as the superuser, the socket, a wrong password) ended."""
    attempts = [
        f"host=127.0.0.1 port={postgres.port} user=postgres dbname=engram",
        f"host=127.0.0.1 port={postgres.port} user=postgres password=wrong dbname=postgres",
        f"host={postgres.data_dir.resolve()} port={postgres.port} user=postgres dbname=engram",
    ]
    answers = []
    for dsn in attempts:
        try:
            psycopg.connect(dsn, connect_timeout=5).close()
            answers.append("connected")
        except psycopg.OperationalError as exc:
            answers.append("password" if "password" in str(exc) else str(exc))
    return answers


def test_postgres_asks_every_client_for_the_password_kept_in_the_home(home: Path) -> None:
    """No trusted login on TCP or the socket; the password is generated once, 0600, under the home."""
    postgres = EmbeddedPostgres.for_home(home, durable=False)
    try:
        url = postgres.start()
        secret = home / "pg_password"
        assert secret.stat().st_mode & 0o777 == 0o600 and secret.read_text() in url
        assert _refused_without_password(postgres) == ["password"] * 3
        with psycopg.connect(_psycopg_dsn(url)) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    finally:
        postgres.stop()


def test_a_cluster_from_an_older_version_gets_a_password_on_start(home: Path) -> None:
    """An older engram made clusters that trusted every login from 127.0.0.1 and kept no password: the
    next start writes the new rules and sets a fresh password before the server listens."""
    data_dir = pg_data_dir_for(home)
    first = EmbeddedPostgres.for_home(home, durable=False)
    first.start()
    first.stop()
    hba = data_dir / "pg_hba.conf"
    hba.write_text("local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n")
    (data_dir / "engram_auth").unlink()
    (home / "pg_password").unlink()
    again = EmbeddedPostgres.for_home(home, durable=False)
    try:
        url = again.start()
        assert "trust" not in hba.read_text() and (home / "pg_password").exists()
        assert _refused_without_password(again) == ["password"] * 3
        with psycopg.connect(_psycopg_dsn(url)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        again.stop()


def test_restart_keeps_postgres_rows_and_queued_redis_messages(home: Path) -> None:
    """A second start on the same dirs finds the data of the first (Redis through its append-only file)."""
    data_dir = pg_data_dir_for(home)
    first = _throwaway_postgres(data_dir)
    broker = EmbeddedRedis(data_dir=home / "redis")
    try:
        with psycopg.connect(_psycopg_dsn(first.start()), autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v vector(3))")
            conn.execute("INSERT INTO kept VALUES ('[1,2,3]')")
        client = redis.Redis.from_url(broker.start())
        client.lpush("celery", "queued-task")
        client.close()
    finally:
        first.stop()
        broker.stop()

    second = _throwaway_postgres(data_dir)
    broker_again = EmbeddedRedis(data_dir=home / "redis")
    try:
        with psycopg.connect(_psycopg_dsn(second.start())) as conn:
            assert conn.execute("SELECT v::text FROM kept").fetchall() == [("[1,2,3]",)]
        client = redis.Redis.from_url(broker_again.start())
        assert client.lrange("celery", 0, -1) == [b"queued-task"]
        client.close()
    finally:
        second.stop()
        broker_again.stop()


def test_a_second_server_on_a_live_data_dir_is_refused(home: Path) -> None:
    running = _throwaway_postgres(pg_data_dir_for(home))
    running_broker = EmbeddedRedis(data_dir=home / "redis")
    try:
        running.start()
        running_broker.start()
        with pytest.raises(EmbeddedServiceError, match="already running"):
            _throwaway_postgres(pg_data_dir_for(home)).start()
        with pytest.raises(EmbeddedServiceError, match="already running"):
            EmbeddedRedis(data_dir=home / "redis").start()
    finally:
        running.stop()
        running_broker.stop()


def test_a_killed_server_leaves_state_the_next_start_recovers_from(home: Path) -> None:
    """SIGKILL leaves postmaster.pid and valkey.pid behind; the next start removes them and runs."""
    data_dir = pg_data_dir_for(home)
    postgres = _throwaway_postgres(data_dir)
    broker = EmbeddedRedis(data_dir=home / "redis")
    postgres.start()
    broker.start()
    for pid in (postgres.pid, broker.pid):
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    postgres.stop()  # reaps
    broker.stop()
    assert (data_dir / "postmaster.pid").exists() and broker.pidfile.exists()

    again = _throwaway_postgres(data_dir)
    broker_again = EmbeddedRedis(data_dir=home / "redis")
    try:
        with psycopg.connect(_psycopg_dsn(again.start())) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert redis.Redis.from_url(broker_again.start()).ping()
    finally:
        again.stop()
        broker_again.stop()


def test_a_port_taken_by_another_server_is_skipped(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If a port is grabbed between free_port() and bind(), start retries on another one and never
    mistakes the server that holds it for its own."""
    first_pg = _throwaway_postgres(home / "first" / "pg")
    first_redis = EmbeddedRedis(data_dir=home / "first" / "redis")
    second_pg = _throwaway_postgres(home / "second" / "pg")
    second_redis = EmbeddedRedis(data_dir=home / "second" / "redis")
    (home / "first").mkdir(mode=0o755)
    (home / "second").mkdir(mode=0o755)
    try:
        first_pg.start()
        first_redis.start()
        taken = iter([first_pg.port, first_redis.port])
        monkeypatch.setattr(embedded, "free_port", lambda: next(taken, None) or free_port())
        second_pg.start()
        second_redis.start()
        assert second_pg.port not in (first_pg.port, None)
        assert second_redis.port not in (first_redis.port, None)
        with psycopg.connect(_psycopg_dsn(second_pg.url)) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
            assert row is not None and Path(row[0]) == (home / "second" / "pg").resolve()
        client = redis.Redis.from_url(second_redis.url)
        assert client.info("server")["process_id"] == second_redis.pid
        client.close()
    finally:
        for server in (second_pg, second_redis, first_pg, first_redis):
            server.stop()


_PARENT_SCRIPT = """
import sys, time
from pathlib import Path
from api.serve.embedded import EmbeddedPostgres, EmbeddedRedis, pg_data_dir_for
home = Path(sys.argv[1])
postgres = EmbeddedPostgres(data_dir=pg_data_dir_for(home))
broker = EmbeddedRedis(data_dir=home / "redis")
postgres.start()
broker.start()
print(postgres.pid, broker.pid, flush=True)
time.sleep(120)
"""


def test_servers_die_with_a_sigkilled_parent(home: Path) -> None:
    """PR_SET_PDEATHSIG survives the switch to the postgres user: no orphan outlives `engram serve`."""
    with subprocess.Popen(
        [sys.executable, "-c", _PARENT_SCRIPT, str(home)], cwd=REPO, stdout=subprocess.PIPE, text=True
    ) as parent:
        try:
            assert parent.stdout is not None
            line = parent.stdout.readline()
            pids = [int(pid) for pid in line.split()]
            assert len(pids) == 2, line
            for pid in pids:
                assert psutil.Process(pid).ppid() == parent.pid
        finally:
            parent.kill()
    for pid in pids:
        assert _wait_gone(pid), f"pid {pid} outlived its SIGKILLed parent"
    # The postmaster got SIGINT (fast shutdown), so it left no postmaster.pid behind either.
    assert not (pg_data_dir_for(home) / "postmaster.pid").exists()


def test_a_restart_reads_back_the_buffers_it_had(home: Path) -> None:
    """pg_prewarm's autoprewarm: the pages in shared buffers at shutdown are loaded again at start (a 1M
    tenant's HNSW index is GBs: read lazily, the first searches after a restart took hundreds of ms)."""
    data_dir = pg_data_dir_for(home)
    first = _throwaway_postgres(data_dir)
    try:
        with psycopg.connect(_psycopg_dsn(first.start()), autocommit=True) as conn:
            conn.execute("CREATE TABLE warm AS SELECT g, repeat('x', 400) AS pad FROM generate_series(1, 5000) g")
            conn.execute("SELECT count(*) FROM warm").fetchone()
    finally:
        first.stop()
    assert (data_dir / "autoprewarm.blocks").stat().st_size > 0

    second = _throwaway_postgres(data_dir)
    try:
        with psycopg.connect(_psycopg_dsn(second.start()), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_buffercache")
            pages = conn.execute("SELECT pg_relation_size('warm') / current_setting('block_size')::int").fetchone()
            assert pages is not None and pages[0] > 100

            def cached() -> int:
                row = conn.execute(
                    "SELECT count(*) FROM pg_buffercache b JOIN pg_class c"
                    " ON b.relfilenode = pg_relation_filenode(c.oid) WHERE c.relname = 'warm'"
                ).fetchone()
                return int(row[0]) if row else 0

            deadline = time.monotonic() + 20
            while cached() < pages[0] and time.monotonic() < deadline:
                time.sleep(0.2)  # the autoprewarm worker loads them in the background
            assert cached() >= pages[0]  # nothing has read the table since the start
    finally:
        second.stop()
