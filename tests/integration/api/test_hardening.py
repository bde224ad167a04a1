"""Input hardening (CONTRACT section 8): odd credentials, cookies, query values, asset names, streamed bodies
and datasource URLs are all answered with the JSON error shape and a 4xx, never a 500."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

import pytest

from tests.helpers.api import OPERATOR_KEY, assert_error

NON_ASCII_TOKENS = ["\xe9", "egk_\xe9", "egop_\xe9\xe9", OPERATOR_KEY + "\xe9"]


# 1. Non-ASCII credentials.


@pytest.mark.parametrize("token", NON_ASCII_TOKENS)
@pytest.mark.parametrize("path", ["/v1/memories", "/v1/jobs", "/dashboard/api/summary", "/metrics"])
def test_non_ascii_bearer_token_is_401(client, token, path):
    """Header values arrive as latin-1 text; comparing them with the operator key must not raise."""
    response = client.get(path, headers={"Authorization": f"Bearer {token}".encode("latin-1")})
    assert_error(response, 401, "unauthorized")


def test_non_ascii_bearer_token_on_the_dashboard_page_shows_the_form(client):
    response = client.get("/dashboard", headers={"Authorization": b"Bearer \xe9"})
    assert response.status_code == 200 and 'name="key"' in response.text


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"key=%C3%A9", "application/x-www-form-urlencoded"),
        (b"key=" + OPERATOR_KEY.encode() + b"%C3%A9", "application/x-www-form-urlencoded"),
        ('{"key": "\u00e9"}'.encode(), "application/json"),
        (b'{"key": "\\ud800"}', "application/json"),
    ],
)
def test_non_ascii_sign_in_key_is_401(app, content, content_type):
    from fastapi.testclient import TestClient

    browser = TestClient(app, raise_server_exceptions=False)
    response = browser.post(
        "/dashboard/login", content=content, headers={"Content-Type": content_type}, follow_redirects=False
    )
    assert response.status_code == 401 and "not the operator key" in response.text
    assert "set-cookie" not in response.headers


def test_operator_key_still_signs_in_and_authenticates(app, client):
    from fastapi.testclient import TestClient

    browser = TestClient(app, raise_server_exceptions=False)
    response = browser.post("/dashboard/login", data={"key": OPERATOR_KEY}, follow_redirects=False)
    assert response.status_code == 303
    assert client.get("/dashboard/api/summary", headers={"Authorization": f"Bearer {OPERATOR_KEY}"}).status_code == 200


# 2. Dashboard cookie and sign-in body.

BAD_COOKIES = [
    b"\xb2.a.b",  # "\u00b2".isdigit() is True, int() refuses it
    b"\xb2\xb3\xb9" * 4 + b".a.b",
    b"9" * 5000 + b".a.b",  # over int()'s digit limit
    b"9999999999.a.\xe9",  # non-ASCII signature
    b"9999999999.\xe9.abc",
    b"\xe9",
    b"..",
    b"-1.a.b",
    b"99999999999999999999.a.b",
]


@pytest.mark.parametrize("cookie", BAD_COOKIES, ids=lambda c: repr(c[:16]))
def test_malformed_session_cookie_is_signed_out(client, cookie):
    headers = {"Cookie": b"engram_dashboard=" + cookie}
    assert_error(client.get("/dashboard/api/summary", headers=headers), 401, "unauthorized")
    assert_error(client.get("/metrics", headers=headers), 401, "unauthorized")
    page = client.get("/dashboard", headers=headers)
    assert page.status_code == 200 and 'name="key"' in page.text


def test_valid_session_cookie_rejects_odd_values_without_raising():
    from api.dashboard.routes import make_session_cookie, valid_session_cookie

    cookie = make_session_cookie(operator_key="k1")
    assert valid_session_cookie(cookie, operator_key="k1")
    assert valid_session_cookie(cookie, operator_key="k\xe9") is False
    assert valid_session_cookie(make_session_cookie(operator_key="k\xe9"), operator_key="k\xe9")
    for value in ("\xb2.a.b", "9" * 5000 + ".a.b", "9999999999.a.\xe9", "9999999999.\ud800.x", "1" * 13 + ".a.b"):
        assert valid_session_cookie(value, operator_key="k1") is False
    expires, nonce, signature = cookie.split(".")
    assert not valid_session_cookie(f"{expires}.{nonce}.{signature}\xe9", operator_key="k1")
    assert not valid_session_cookie(cookie, operator_key="k1", now=time.time() + 13 * 3600)


@pytest.mark.parametrize("body", [b"[" * 5000, b'{"key":' * 5000, b'{"key": "x"'], ids=["array", "object", "truncated"])
def test_sign_in_with_unparseable_json_is_400(app, body):
    from fastapi.testclient import TestClient

    browser = TestClient(app, raise_server_exceptions=False)
    response = browser.post(
        "/dashboard/login", content=body, headers={"Content-Type": "application/json"}, follow_redirects=False
    )
    assert_error(response, 400, "bad_request")
    assert "set-cookie" not in response.headers


# 3. Numeric query values.


@pytest.mark.parametrize(
    "limit", ["%C2%B2", "%C2%B9%C2%B2", "%D9%A3", "1" * 5000, "-1", "0", "201", "1.5", ""], ids=lambda v: v[:12]
)
def test_jobs_limit_that_is_not_a_plain_number_is_422(client, tenant, limit):
    response = client.get(f"/v1/jobs?limit={limit}", headers=tenant.headers())
    assert assert_error(response, 422, "validation_error")["field"] == "limit"


def test_jobs_limit_in_range_still_works(client, tenant):
    assert client.get("/v1/jobs?limit=200", headers=tenant.headers()).status_code == 200


def test_parse_filters_rejects_unicode_digits():
    from core.errors import Invalid
    from core.jobs.queries import parse_filters

    for raw in ("\u00b2", "\u0663", "\uff11", "9" * 5000):
        with pytest.raises(Invalid):
            parse_filters({"limit": raw}, tenant_id=None)
    assert parse_filters({"limit": "7"}, tenant_id=None).limit == 7


# 4. Asset names.


@pytest.mark.parametrize(
    "name", ["a" * 5000 + ".css", "\xe9" * 300 + ".js", "a" * 255 + ".css"], ids=["5000", "non-ascii", "259"]
)
def test_overlong_asset_name_is_404(client, name):
    assert_error(client.get(f"/dashboard/static/{name}"), 404, "not_found")


# 5. Streamed (chunked) bodies over the limit.


def _chunks(total: int, size: int = 1024 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        piece = min(size, total - sent)
        sent += piece
        yield b" " * piece


def test_chunked_body_over_the_limit_is_413(client, tenant):
    from api.app import MAX_BODY_BYTES

    before = client.get("/v1/memories", headers=tenant.headers()).json()
    response = client.post(
        "/v1/memories",
        content=_chunks(MAX_BODY_BYTES + 1),
        headers={**tenant.headers(), "Content-Type": "application/json"},
    )
    assert "content-length" not in response.request.headers
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert_error(response, 413, "payload_too_large")
    assert client.get("/v1/memories", headers=tenant.headers()).json() == before


def test_chunked_body_over_the_limit_on_a_form_route_is_413(app):
    from fastapi.testclient import TestClient

    from api.app import MAX_BODY_BYTES

    browser = TestClient(app, raise_server_exceptions=False)
    response = browser.post(
        "/dashboard/login",
        content=_chunks(MAX_BODY_BYTES + 10),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert_error(response, 413, "payload_too_large")


def test_chunked_body_under_the_limit_still_works(client, tenant):
    body = b'{"content": "sent in chunks"}'
    response = client.post(
        "/v1/memories",
        content=iter([body[:10], body[10:]]),
        headers={**tenant.headers(), "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text


def test_declared_length_is_parsed_strictly():
    from api.app import _declared_length

    assert _declared_length("12") == 12 and _declared_length(None) is None
    for bad in ("\u00b2", "9" * 5000, "-1", "1e9", ""):
        assert _declared_length(bad) is None


# 6 and 7. Datasource URLs.


@pytest.fixture
def sqlite_db(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "source.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE t (a INTEGER)")
    connection.commit()
    connection.close()
    return path


def _create(client, tenant, url: str):  # type: ignore[no-untyped-def]
    return client.post("/v1/datasources", json={"name": "ds", "url": url}, headers=tenant.headers())


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("postgresql+asyncpg://u:hunter2@127.0.0.1:1/db", "asyncpg"),
        ("sqlite+aiosqlite:///{db}", "aiosqlite"),
        ("mssql+pyodbc://u:hunter2@127.0.0.1:1/db", "pyodbc"),
        ("oracle://u:hunter2@127.0.0.1:1/db", "oracle"),
        ("sqlite:///{db}?timeout=abc", "abc"),
        ("sqlite:///{db}?check_same_thread=maybe", "maybe"),
        ("mysql+pymysql://u:hunter2@127.0.0.1:1/db?connect_timeout=abc", "abc"),
        ("mysql+pymysql://u:hunter2@127.0.0.1:1/db?charset=bogus", "cannot reach the source"),
        ("postgresql://u:hunter2@127.0.0.1:1/db", "cannot reach the source"),
        ("mysql://u:hunter2@127.0.0.1:1/db", "cannot reach the source"),
    ],
)
def test_datasource_url_the_server_cannot_open_is_422(client, tenant, sqlite_db, url, hint):
    response = _create(client, tenant, url.format(db=sqlite_db))
    error = assert_error(response, 422, "validation_error")
    assert error["field"] == "url" and hint in error["message"], error
    assert "hunter2" not in response.text
    assert client.get("/v1/datasources/ds", headers=tenant.headers()).status_code == 404


def test_bare_mysql_url_uses_an_installed_driver():
    pytest.importorskip("pymysql")
    from core.entities.sources import parse_source_url

    assert parse_source_url("mysql://u:p@db.example/x").drivername == "mysql+pymysql"
    assert parse_source_url("postgresql://u:p@db.example/x").get_dialect().import_dbapi() is not None


@pytest.mark.parametrize(
    "path", ["/proc/self/environ", "/proc/self/../self/status", "/sys/kernel/hostname", "/dev/null", "/dev/zero"]
)
def test_sqlite_datasource_cannot_name_kernel_or_device_files(client, tenant, path):
    error = assert_error(_create(client, tenant, f"sqlite:///{path}"), 422, "validation_error")
    assert error["field"] == "url"


def test_sqlite_datasource_through_a_symlink_into_proc_is_422(client, tenant, tmp_path):
    link = tmp_path / "innocent.db"
    link.symlink_to("/proc/self/environ")
    assert_error(_create(client, tenant, f"sqlite:///{link}"), 422, "validation_error")


def test_sqlite_datasource_must_be_a_sqlite_file(client, tenant, tmp_path):
    """A file that is not SQLite and a missing file get the same answer: the check is no file-system probe."""
    text_file = tmp_path / "notes.db"
    text_file.write_text("these are not the tables you are looking for")
    missing = tmp_path / "missing.db"
    answers = []
    for path in (text_file, missing, "/etc/passwd", tmp_path):
        error = assert_error(_create(client, tenant, f"sqlite:///{path}"), 422, "validation_error")
        assert error["field"] == "url" and error["message"].startswith("no SQLite database file at")
        answers.append(error["message"].replace(str(path), "PATH"))
    assert len(set(answers)) == 1
    assert not missing.exists()


def test_sqlite_datasource_with_a_real_database_is_accepted(client, tenant, sqlite_db):
    response = _create(client, tenant, f"sqlite:///{sqlite_db}")
    assert response.status_code == 201, response.text
    assert client.delete("/v1/datasources/ds", headers=tenant.headers()).status_code in (200, 204)


@pytest.mark.parametrize("url", ["sqlite:///" + "a" * 5000 + ".db", "sqlite:////tmp/x%00y.db"], ids=["long", "nul"])
def test_sqlite_datasource_with_an_odd_path_is_422(client, tenant, url):
    assert_error(_create(client, tenant, url), 422, "validation_error")


def test_sqlite_roots_confine_sqlite_datasources(client, tenant, sqlite_db, tmp_path, monkeypatch):
    from core.config import reset_settings_cache

    inside = tmp_path / "allowed"
    inside.mkdir()
    (inside / "in.db").write_bytes(sqlite_db.read_bytes())
    monkeypatch.setenv("ENGRAM_SQLITE_ROOTS", f"{inside}, /nonexistent-root")
    reset_settings_cache()
    try:
        error = assert_error(_create(client, tenant, f"sqlite:///{sqlite_db}"), 422, "validation_error")
        assert "ENGRAM_SQLITE_ROOTS" in error["message"]
        response = _create(client, tenant, f"sqlite:///{inside / 'in.db'}")
        assert response.status_code == 201, response.text
        # A symlink inside the root that points out of it is judged by its target.
        (inside / "escape.db").symlink_to(sqlite_db)
        body = {"name": "ds2", "url": f"sqlite:///{inside / 'escape.db'}"}
        assert_error(client.post("/v1/datasources", json=body, headers=tenant.headers()), 422, "validation_error")
    finally:
        monkeypatch.delenv("ENGRAM_SQLITE_ROOTS")
        reset_settings_cache()
