"""Which datasources the server opens (core.source_guard): never engram's own database, however
spelled; in hosted mode no loopback, private, link-local or metadata host unless allowed; one generic
answer for every connection failure; SQLite confined to its roots and opened read-only."""

from __future__ import annotations

import ipaddress
import os
import socket
import sqlite3
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import make_url

from tests.helpers.catalog import PG_URL_ENV

GENERIC = "cannot reach the source"


def _create(client, tenant, url: str, name: str = "ds"):  # type: ignore[no-untyped-def]
    return client.post("/v1/datasources", json={"name": name, "url": url}, headers=tenant.headers())


@pytest.fixture
def mode(monkeypatch: pytest.MonkeyPatch) -> Iterator:  # type: ignore[type-arg]
    """Switch ENGRAM_DATASOURCE_POLICY / allow-list / SQLite roots for one test (the suite runs in local mode)."""
    from core.config import reset_settings_cache

    def set_mode(policy: str, *, allow: str | None = None, roots: str | None = None) -> None:
        monkeypatch.setenv("ENGRAM_DATASOURCE_POLICY", policy)
        for name, value in (("ENGRAM_DATASOURCE_ALLOW_HOSTS", allow), ("ENGRAM_SQLITE_ROOTS", roots)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        reset_settings_cache()

    yield set_mode
    monkeypatch.undo()
    reset_settings_cache()


@pytest.fixture
def engram_db(stack):  # type: ignore[no-untyped-def]
    url = make_url(stack.database_url)
    redis = make_url(stack.redis_url)
    return {"port": url.port, "user": url.username, "password": url.password or "", "redis_port": redis.port}


def _own_spellings(port: int, redis_port: int, password: str) -> list[str]:
    """engram's own PostgreSQL (and broker) under every spelling we could think of."""
    pw = f":{password}" if password else ""
    user = f"postgres{pw}"
    spellings = [
        f"postgresql://{user}@127.0.0.1:{port}/engram",
        f"postgresql+psycopg://{user}@127.0.0.1:{port}/engram?sslmode=disable",
        f"postgresql://{user}@localhost:{port}/engram",
        f"postgresql://{user}@LocalHost:{port}/engram",
        f"postgresql://{user}@127.1:{port}/engram",
        f"postgresql://{user}@127.0.0.2:{port}/engram",
        f"postgresql://{user}@0x7f000001:{port}/engram",
        f"postgresql://{user}@2130706433:{port}/engram",
        f"postgresql://{user}@017700000001:{port}/engram",
        f"postgresql://{user}@0.0.0.0:{port}/engram",
        f"postgresql://{user}@0:{port}/engram",
        f"postgresql://{user}@[::1]:{port}/engram",
        f"postgresql://{user}@[::ffff:127.0.0.1]:{port}/engram",
        f"postgresql://{user}@[::ffff:7f00:1]:{port}/engram",
        f"postgresql://{user}@[64:ff9b::7f00:1]:{port}/engram",
        f"postgresql://{user}@[2002:7f00:1::]:{port}/engram",
        f"postgresql://{user}@%31%32%37.0.0.1:{port}/engram",
        f"postgresql://{user}@127.0.0.1:{port}/postgres",
        f"postgresql://{user}@127.0.0.1:{port}/template1",
        f"postgresql://{user}@127.0.0.1:{port}",
        f"postgresql://{user}@127.0.0.1/engram?port={port}",
        f"postgresql://{user}@/engram?host=127.0.0.1&port={port}",
        f"postgresql://{user}@/engram?host=localhost&port={port}",
        f"postgresql://{user}@/e%6Egram?host=%31%32%37.0.0.1&port={port}",
        f"postgresql://{user}@/engram?host=/tmp&port={port}",
        f"postgresql://{user}@/engram?host=/var/run/postgresql&port={port}",
        f"postgresql://{user}@/engram?port={port}",
        f"mysql+pymysql://root@127.0.0.1:{port}/engram",
        f"mysql+pymysql://root@localhost:{port}/engram",
        f"mysql+pymysql://root@/engram?unix_socket=/tmp/.s.PGSQL.{port}",
        f"postgresql://{user}@127.0.0.1:{redis_port}/0",
        # The database name on any server of this machine (a proxy in front of engram's, say).
        "postgresql://postgres@127.0.0.1:5432/engram",
        "postgresql://postgres@localhost:5432/test?dbname=engram",
    ]
    for address in _this_machines_addresses():
        spellings.append(f"postgresql://{user}@{address}:{port}/engram")
    return spellings


def _this_machines_addresses() -> list[str]:
    """The machine's own non-loopback addresses and its host name (each reaches a 0.0.0.0 listener)."""
    import psutil

    found = [socket.gethostname()]
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            try:
                address = ipaddress.ip_address(entry.address.split("%")[0])
            except ValueError:
                continue
            if not address.is_loopback and not address.is_link_local:
                found.append(f"[{address}]" if address.version == 6 else str(address))
    return found[:4]


@pytest.mark.parametrize("policy", ["local", "hosted"])
def test_engrams_own_database_is_never_a_datasource(client, tenant, engram_db, mode, policy):
    """Every spelling of engram's own database (host, port, socket, name, encoding) is 422 naming it, in
    both modes, even with an allow-list that admits every loopback and private address."""
    allow = "127.0.0.0/8,::1/128,0.0.0.0/8,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,::/0,localhost,/tmp"
    mode(policy, allow=allow if policy == "hosted" else None)
    spellings = _own_spellings(engram_db["port"], engram_db["redis_port"], engram_db["password"])
    answers = {}
    for url in spellings:
        response = _create(client, tenant, url)
        answers[url] = (response.status_code, response.json().get("error", {}).get("message", ""))
    # Hosted mode refuses MySQL's unix_socket parameter before it looks where the socket leads.
    expected = ("own database",) if policy == "local" else ("own database", "'unix_socket' is not accepted")
    wrong = {
        url: answer for url, answer in answers.items() if answer[0] != 422 or not any(e in answer[1] for e in expected)
    }
    assert not wrong, wrong
    assert client.get("/v1/datasources", headers=tenant.headers()).json()["datasources"] == []


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("hostaddr=127.0.0.1", "hostaddr"),
        ("service=engram", "service"),
        ("servicefile=/etc/passwd", "servicefile"),
        ("passfile=/root/.pgpass", "passfile"),
        ("host=127.0.0.1,10.0.0.1", "one host"),
        ("host=a.example&host=b.example", "one host"),
        ("port=5432,5433", "one host"),
    ],
)
def test_parameters_that_redirect_a_postgresql_url_are_refused(client, tenant, query, param):
    response = _create(client, tenant, f"postgresql://u@db.example.com:5432/x?{query}")
    error = response.json()["error"]
    assert response.status_code == 422 and error["field"] == "url" and param in error["message"], error


@pytest.mark.parametrize("query", ["read_default_file=/etc/mysql/my.cnf", "local_infile=1", "read_default_group=x"])
def test_mysql_parameters_that_read_server_files_are_refused(client, tenant, query):
    response = _create(client, tenant, f"mysql+pymysql://u@db.example.com/x?{query}")
    assert response.status_code == 422 and query.split("=")[0] in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "localhost",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "100.100.100.200",
        "168.63.129.16",
        "224.0.0.1",
        "0.0.0.0",
        "[::]",
        "[::1]",
        "[fe80::1]",
        "[fd00:ec2::254]",
        "[fc00::1]",
        "[::ffff:10.0.0.1]",
        "[64:ff9b::a00:1]",
        "240.0.0.1",
    ],
)
def test_hosted_mode_refuses_non_public_hosts(client, tenant, mode, host):
    mode("hosted")
    response = _create(client, tenant, f"postgresql://u:pw@{host}:5432/db")
    error = response.json()["error"]
    assert response.status_code == 422 and "not allowed on this server" in error["message"], (host, error)
    assert "ENGRAM_DATASOURCE_ALLOW_HOSTS" in error["message"]


def test_hosted_mode_refuses_sockets_unless_allowed(client, tenant, mode):
    mode("hosted")
    for url in ("postgresql://u@/db?host=/var/run/postgresql", "postgresql://u@/db"):
        response = _create(client, tenant, url)
        assert response.status_code == 422 and "local sockets" in response.json()["error"]["message"]
    response = _create(client, tenant, "mysql+pymysql://u@/db?unix_socket=/run/mysqld/mysqld.sock")
    assert response.status_code == 422 and "unix_socket" in response.json()["error"]["message"]


def test_hosted_mode_allow_list_admits_what_the_operator_names(client, tenant, mode):
    """A CIDR or a host name in ENGRAM_DATASOURCE_ALLOW_HOSTS admits a private source; the rest stays
    refused. With the real server at 127.0.0.1:5432 the admitted URL registers."""
    url = os.environ.get(PG_URL_ENV)
    if not url:
        pytest.skip(f"{PG_URL_ENV} is not set")
    source = make_url(url)
    by_ip = source.set(host="127.0.0.1").render_as_string(hide_password=False)
    by_name = source.set(host="localhost").render_as_string(hide_password=False)
    mode("hosted", allow="127.0.0.1/32")
    assert _create(client, tenant, by_ip, "by_cidr").status_code == 201
    # localhost also resolves to ::1 on some machines, which the CIDR does not cover.
    mode("hosted", allow="localhost")
    assert _create(client, tenant, by_name, "by_name").status_code == 201
    mode("hosted", allow="10.0.0.0/8, db.internal")
    assert _create(client, tenant, by_ip, "refused").status_code == 422


def test_a_name_resolving_to_a_refused_address_is_refused_and_the_checked_ip_is_dialled(mode):
    """Resolution is judged at connect time, and the driver is pinned to the address that was judged, so a
    DNS answer that changes afterwards (rebinding) cannot move the connection."""
    from core.source_guard import SourceRefused, check_target, parse_target, pin_target

    mode("hosted")
    url = make_url("postgresql+psycopg://u:pw@db.example.com:5433/x?host=db.example.com")
    answers = iter([[ipaddress.ip_address("93.184.216.34")], [ipaddress.ip_address("127.0.0.1")]])

    def rebinding(host: str, port: int) -> list:  # type: ignore[type-arg]
        return next(answers) if host == "db.example.com" else [ipaddress.ip_address(host)]

    target = check_target(parse_target(url), resolve=rebinding)
    pinned, connect_args = pin_target(url, target)
    assert connect_args == {"hostaddr": "93.184.216.34"} and pinned.host == "db.example.com" and pinned.port == 5433
    assert "host" not in pinned.query
    with pytest.raises(SourceRefused, match="not allowed"):
        check_target(parse_target(url), resolve=rebinding)
    mysql = make_url("mysql+pymysql://u@db.example.com/x")
    pinned, _ = pin_target(
        mysql, check_target(parse_target(mysql), resolve=lambda h, p: [ipaddress.ip_address("93.184.216.34")])
    )
    assert pinned.host == "93.184.216.34" and pinned.port == 3306


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port where something accepts and hangs up at once (not a database)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
                connection.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
                connection.close()
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def test_every_connection_failure_gets_the_same_answer(client, tenant, silent_port):
    """Refused, not a database, no such host, no such database: one message, no driver text, so the URL
    check cannot tell services apart (no port scanner)."""
    from api.serve.embedded import free_port

    urls = [
        f"postgresql://u:hunter2@127.0.0.1:{free_port()}/db",
        f"postgresql://u:hunter2@127.0.0.1:{silent_port}/db",
        "postgresql://u:hunter2@no-such-host.invalid:5432/db",
        f"mysql+pymysql://u:hunter2@127.0.0.1:{silent_port}/db",
    ]
    if os.environ.get(PG_URL_ENV):
        urls.append(make_url(os.environ[PG_URL_ENV]).set(database="no_such_db_here").render_as_string(False))
    messages = set()
    for url in urls:
        response = _create(client, tenant, url)
        assert response.status_code == 422, response.text
        messages.add(response.json()["error"]["message"])
        assert "hunter2" not in response.text
    assert len(messages) == 1 and next(iter(messages)).startswith(GENERIC), messages
    assert not any(word in "".join(messages) for word in ("refused", "timeout", "SSL", "resolve", "Operational"))


@pytest.fixture
def sqlite_file(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "source.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE t (a INTEGER)")
    return path


def test_hosted_mode_needs_sqlite_roots(client, tenant, mode, sqlite_file, tmp_path):
    mode("hosted")
    response = _create(client, tenant, f"sqlite:///{sqlite_file}")
    assert response.status_code == 422 and "ENGRAM_SQLITE_ROOTS" in response.json()["error"]["message"]
    mode("hosted", roots=str(tmp_path))
    assert _create(client, tenant, f"sqlite:///{sqlite_file}").status_code == 201


def test_engrams_own_files_are_never_sqlite_sources(client, tenant, stack, mode):
    """Even in local mode nothing under engram's home is read as a source (indexes, secrets, state)."""
    mode("local")
    inside = stack.home / "planted.db"
    with sqlite3.connect(inside) as connection:
        connection.execute("CREATE TABLE secrets (v TEXT)")
    try:
        for url in (f"sqlite:///{inside}", f"sqlite:///{stack.home}/../{stack.home.name}/planted.db"):
            response = _create(client, tenant, url)
            assert response.status_code == 422 and "engram's own files" in response.json()["error"]["message"]
    finally:
        inside.unlink()


def test_sqlite_sources_are_opened_read_only(sqlite_file, tmp_path):
    """Opening never creates a missing file, and the engine cannot write to an existing one."""
    import sqlalchemy as sa

    from core.entities.sources import SourceError, source_engine

    with source_engine(make_url(f"sqlite:///{sqlite_file}")) as engine, engine.connect() as connection:
        with pytest.raises(sa.exc.OperationalError, match="readonly|read-only|query_only"):
            connection.execute(sa.text("INSERT INTO t VALUES (1)"))
    missing = tmp_path / "gone.db"
    with pytest.raises(SourceError, match="no SQLite database file"), source_engine(make_url(f"sqlite:///{missing}")):
        pass
    assert not missing.exists()


def test_the_startup_line_says_what_is_allowed(mode, tmp_path):
    from core.source_guard import describe_policy

    mode("local")
    assert "local mode" in describe_policy() and "loopback and private" in describe_policy()
    mode("hosted", allow="10.0.0.0/8", roots=str(tmp_path))
    line = describe_policy()
    assert "hosted mode" in line and "10.0.0.0/8" in line and str(tmp_path) in line and "\n" not in line


def test_the_datasource_drivers_are_dependencies():
    """PostgreSQL and MariaDB sources work out of the box: their drivers install with engram."""
    import tomllib
    from pathlib import Path

    from core.entities.sources import parse_source_url

    project = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())["project"]
    names = {spec.split("==")[0].split("[")[0].lower() for spec in project["dependencies"]}
    assert {"psycopg", "pymysql"} <= names
    assert parse_source_url("mysql://u:p@db.example.com/x").drivername == "mysql+pymysql"
    assert parse_source_url("mariadb://u:p@db.example.com/x").drivername == "mariadb+pymysql"


def test_a_host_list_in_the_authority_is_refused(client, tenant):
    response = _create(client, tenant, "postgresql://u@db.example.com,127.0.0.1:5432/x")
    assert response.status_code == 422 and "one host" in response.json()["error"]["message"]


def test_the_mode_is_the_setting_else_a_running_serves_else_hosted(monkeypatch, tmp_path):
    """`engram api` and `engram worker` default to hosted; a CLI or `engram mcp` process on the home of a
    running `engram serve` follows serve's local mode through runtime.json; the setting wins over both."""
    from core.config import reset_settings_cache
    from core.runtime import write_runtime
    from core.source_guard import policy

    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path))
    monkeypatch.delenv("ENGRAM_DATASOURCE_POLICY", raising=False)
    reset_settings_cache()
    try:
        assert policy() == "hosted"
        write_runtime({"pid": os.getpid(), "datasource_policy": "local"}, tmp_path)
        assert policy() == "local"
        write_runtime({"pid": 2**22 + 7, "datasource_policy": "local"}, tmp_path)  # a serve that is gone
        assert policy() == "hosted"
        write_runtime({"pid": os.getpid(), "datasource_policy": "local"}, tmp_path)
        monkeypatch.setenv("ENGRAM_DATASOURCE_POLICY", "HOSTED")
        reset_settings_cache()
        assert policy() == "hosted"
    finally:
        monkeypatch.undo()
        reset_settings_cache()


def test_hosted_mode_refuses_driver_parameters_that_read_server_files(client, tenant, mode):
    mode("hosted")
    for url in (
        "postgresql://u@db.example.com/x?sslrootcert=/etc/engram/ca.pem",
        "postgresql://u@db.example.com/x?sslkey=/root/.ssh/id_rsa",
        "mysql+pymysql://u@db.example.com/x?ssl_ca=/etc/ssl/private/key.pem",
    ):
        response = _create(client, tenant, url)
        assert response.status_code == 422 and "not accepted by this server" in response.json()["error"]["message"]
    from core.source_guard import parse_target

    target = parse_target(make_url("postgresql://u@db.example.com/x?sslrootcert=system&sslmode=verify-full"))
    assert target.host == "db.example.com" and target.port == 5432
