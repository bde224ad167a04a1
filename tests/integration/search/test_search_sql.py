"""The search's driver SQL sends a list of strings the SQL casts to text[] as the array's literal text: what
PostgreSQL parses from it is the list itself, whatever the strings hold, and a query by such ids finds them."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import any_, select, text

from core.db import tenant_session
from core.memories.models import Memory
from core.search import sql

AWKWARD = ["plain", 'quote " inside', "back\\slash", 'both \\" mixed', "", "NULL", "{a,b}", "comma, space", "ünïcödé"]


def save(client, tenant, body):  # type: ignore[no-untyped-def]
    response = client.post("/v1/memories", json=body, headers=tenant.headers())
    assert response.status_code == 201, response.text
    return response.json()["memory_id"]


def test_text_array_literals_parse_back_to_the_same_strings(client, tenant):
    with tenant_session(tenant.tenant_id) as session:
        driver = session.connection().connection.driver_connection
        for items in (AWKWARD, [], ["only"]):
            got = driver.execute("SELECT %(items)s::TEXT[]", {"items": sql.array_literal(items)}).fetchone()[0]
            assert got == items


def test_a_driver_query_with_a_text_array_parameter_finds_the_rows_it_names(client, tenant):
    ids = [save(client, tenant, {"id": f'sql-"{n}"', "content": f"note {n} about arrays"}) for n in range(3)]
    tenant_id = tenant.tenant_id

    def build():  # type: ignore[no-untyped-def]
        return select(Memory.id).where(Memory.tenant_id == tenant_id, Memory.id == any_(sql.text_array("ids")))

    with tenant_session(tenant_id) as session:
        rows = sql.run(session, ("test-array", tenant_id), build, ids=[ids[0], ids[2], "missing \\ one"])
    assert sorted(row[0] for row in rows) == sorted([ids[0], ids[2]])


def test_values_written_into_the_sql_read_back_as_they_were(client, tenant):
    """Every value a statement is given is written into its text as a literal: what PostgreSQL reads from it
    is the value itself, whatever a string holds; a string with a NUL is refused, as psycopg refuses it."""
    with tenant_session(tenant.tenant_id) as session:
        driver = session.connection().connection.driver_connection
        quote = sql.quoter(driver)
        values = [*AWKWARD, "it's", "100% sure", -3, 0, 2**40, 0.1, True, None]
        for value in values:
            sql.send(driver, f"SELECT {quote(value)}")
            (got,) = sql.receive(driver)[0][0]
            assert got == value, value
        for items in (AWKWARD, [], ["only"]):
            sql.send(driver, f"SELECT {quote(items)}::TEXT[]")
            assert sql.receive(driver)[0][0] == (items,)
        # A list holding something else than strings is left to psycopg to adapt.
        assert quote(["a", "b"]) == "'{\"a\",\"b\"}'"
        with pytest.raises(psycopg.DataError):
            quote("nul \x00 inside")


def test_several_statements_go_in_one_message_and_the_first_error_stops_the_rest(client, tenant):
    tenant_id = tenant.tenant_id
    with tenant_session(tenant_id) as session:
        first, second = sql.run_many(
            session,
            [
                (("test-text", 1), lambda: text("SELECT CAST(:tenant AS bigint), '100%'"), {"tenant": tenant_id}),
                (("test-text", 2), lambda: text("SELECT generate_series(1, :n)"), {"n": 3}),
            ],
        )
        assert first == [(tenant_id, "100%")]
        assert second == [(1,), (2,), (3,)]
    with tenant_session(tenant_id) as session, pytest.raises(psycopg.errors.DivisionByZero):
        sql.run_many(
            session,
            [
                (("test-error", 1), lambda: text("SELECT 1 / :zero"), {"zero": 0}),
                (("test-error", 2), lambda: text("SELECT 1"), {}),
            ],
        )
