"""The search's driver SQL sends a list of strings the SQL casts to text[] as the array's literal text: what
PostgreSQL parses from it is the list itself, whatever the strings hold, and a query by such ids finds them."""

from __future__ import annotations

from sqlalchemy import any_, select

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
    # A list holding something else than strings is left to psycopg to adapt.
    assert sql._params({}, {"ids": ["a", 1]}, frozenset({"ids"})) == {"ids": ["a", 1]}
    assert sql._params({}, {"ids": ["a", "b"]}, frozenset({"ids"})) == {"ids": '{"a","b"}'}
