"""The search's driver SQL sends a list of strings the SQL casts to text[] as the array's literal text: what
PostgreSQL parses from it is the list itself, whatever the strings hold, and a query by such ids finds them."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from sqlalchemy import any_, select, text

from core import sql
from core.db import tenant_session
from core.memories.models import Memory
from tests.helpers.events import listening

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
        rows = sql.run(
            session, sql.Query(("test-array", tenant_id), build, {"ids": [ids[0], ids[2], "missing \\ one"]})
        )
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
        assert quote(["a", "b"]) == '\'{"a","b"}\''
        with pytest.raises(psycopg.DataError):
            quote("nul \x00 inside")


def test_several_statements_go_in_one_message_and_the_first_error_stops_the_rest(client, tenant):
    tenant_id = tenant.tenant_id
    with tenant_session(tenant_id) as session:
        first, second = sql.run_many(
            session,
            [
                sql.Query(
                    ("test-text", 1), lambda: text("SELECT CAST(:tenant AS bigint), '100%'"), {"tenant": tenant_id}
                ),
                sql.Query(("test-text", 2), lambda: text("SELECT generate_series(1, :n)"), {"n": 3}),
            ],
        )
        assert first == [(tenant_id, "100%")]
        assert second == [(1,), (2,), (3,)]
    with tenant_session(tenant_id) as session, pytest.raises(psycopg.errors.DivisionByZero):
        sql.run_many(
            session,
            [
                sql.Query(("test-error", 1), lambda: text("SELECT 1 / :zero"), {"zero": 0}),
                sql.Query(("test-error", 2), lambda: text("SELECT 1"), {}),
            ],
        )


def _prepared(driver):  # type: ignore[no-untyped-def]
    rows = driver.execute("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements").fetchall()
    return {name: (generic, custom) for name, generic, custom in rows if name.startswith("engram_")}


def test_a_generic_statement_is_prepared_once_per_connection_and_runs_on_its_generic_plan(client, tenant):
    """A statement that reads by key is prepared once per connection, under a name the same for every tenant
    (its values are all parameters), and PostgreSQL runs it on one generic plan: it is not planned per call.
    The statements beside it keep their custom plans, and so does whatever the transaction runs next."""
    ids = [save(client, tenant, {"content": f"generic plan note {n}"}) for n in range(3)]

    def by_ids(tenant_id):  # type: ignore[no-untyped-def]
        def build():  # type: ignore[no-untyped-def]
            return select(Memory.id).where(Memory.tenant_id == tenant_id, Memory.id == any_(sql.text_array("ids")))

        return build

    tenant_id = tenant.tenant_id
    mine = sql.Query(("test-generic", tenant_id), by_ids(tenant_id), {"ids": ids[:2]}, generic=True)
    other_tenant = sql.Query(("test-generic", tenant_id + 1), by_ids(tenant_id + 1), {"ids": ids}, generic=True)
    with tenant_session(tenant_id) as session:
        driver = session.connection().connection.driver_connection
        before = _prepared(driver)
        first, custom, mode = sql.run_many(
            session,
            [
                mine,
                sql.Query(("test-text", 3), lambda: text("SELECT CAST(:n AS int) + 1"), {"n": 41}),
                sql.Query("test-mode", lambda: text("SELECT current_setting('plan_cache_mode')"), {}),
            ],
        )
        assert sorted(row[0] for row in first) == sorted(ids[:2])
        assert custom == [(42,)] and mode == [("force_custom_plan",)]
        # Again, for all three ids, and for another tenant's key: the same prepared statement.
        again = sql.run(session, mine._replace(values={"ids": ids}))
        assert sorted(row[0] for row in again) == sorted(ids)
        assert sql.run(session, other_tenant) == []  # (row-level security: not this session's tenant)
        after = _prepared(driver)
        assert driver.execute("SELECT current_setting('plan_cache_mode')").fetchone()[0] == "force_custom_plan"
    # A call that commits leaves the generic setting to its COMMIT (no command of its own to restore it): the
    # connection's next transaction plans for its values again.
    with tenant_session(tenant_id) as session:
        driver = session.connection().connection.driver_connection
        assert len(sql.run(session, mine, commit=True)) == 2
        assert driver.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert driver.execute("SELECT current_setting('plan_cache_mode')").fetchone()[0] == "force_custom_plan"
    added = {name: plans for name, plans in after.items() if name not in before or before[name] != plans}
    assert len(added) == 1, after
    ((generic_plans, custom_plans),) = added.values()
    assert custom_plans == before.get(next(iter(added)), (0, 0))[1]  # never planned for its values
    assert generic_plans - before.get(next(iter(added)), (0, 0))[0] == 3


def test_a_call_that_opens_its_transaction_with_generic_statements_only_sets_their_plans_with_its_tenant(
    client, tenant, make_tenant
):
    """A call that begins the transaction and holds only generic statements sends their plan setting in the
    opening's own command (its tenant's): the statement still runs on its generic plan, under row-level security
    for that tenant, and what follows in the transaction is planned for its values again."""
    mine = [save(client, tenant, {"content": f"opening note {n}"}) for n in range(2)]
    other = make_tenant()
    theirs = save(client, other, {"content": "another tenant's note"})
    # No tenant condition of its own: only the transaction's tenant setting keeps the other tenant's row out.
    query = sql.Query(
        "test-generic-opening",
        lambda: text("SELECT id FROM memories WHERE id = ANY(CAST(:ids AS text[]))"),
        {"ids": [*mine, theirs]},
        generic=True,
    )
    for _ in range(2):  # (the second time on a connection that has it prepared)
        with tenant_session(tenant.tenant_id) as session:
            rows = sql.run(session, query)
            driver = session.connection().connection.driver_connection
            assert sorted(row[0] for row in rows) == sorted(mine)
            setting = "SELECT current_setting('plan_cache_mode'), current_setting('engram.tenant_id')"
            assert driver.execute(setting).fetchone() == ("force_custom_plan", str(tenant.tenant_id))
            (plans,) = driver.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE 'SELECT id FROM memories WHERE id = ANY%'"
            ).fetchall()
            assert plans[0] >= 1 and plans[1] == 0  # (run on its generic plan, never planned for its values)


def test_values_of_a_generic_statement_read_back_as_they_were(client, tenant):
    """A generic statement's values go as parameters in PostgreSQL's text form: each reads back as it was."""
    typed = [(v, "text") for v in [*AWKWARD, "it's", "100% sure"]]
    typed += [(-3, "bigint"), (0, "bigint"), (2**40, "bigint"), (0.1, "float8"), (True, "boolean"), (None, "text")]
    typed += [(items, "text[]") for items in (AWKWARD, [], ["only"])]
    with tenant_session(tenant.tenant_id) as session:
        for value, kind in typed:
            query = sql.Query(
                ("test-generic-value", kind), lambda k=kind: text(f"SELECT CAST(:v AS {k})"), {"v": value}, generic=True
            )
            assert sql.run(session, query) == [(value,)], value
        with pytest.raises(psycopg.DataError):
            sql.run(
                session,
                sql.Query(
                    ("test-generic-value", "text"),
                    lambda: text("SELECT CAST(:v AS text)"),
                    {"v": "a\x00"},
                    generic=True,
                ),
            )


def test_an_error_in_a_pipelined_call_is_raised_and_the_connection_stays_usable(client, tenant):
    """The first error of a call holding a generic statement is raised as a simple query's would be, and the
    next transactions on the connection run the statement again (closed and prepared afresh once)."""
    tenant_id = tenant.tenant_id
    divide = sql.Query(("test-generic-divide", 1), lambda: text("SELECT 10 / CAST(:d AS int)"), {"d": 0}, generic=True)
    with tenant_session(tenant_id) as session, pytest.raises(psycopg.errors.DivisionByZero):
        sql.run_many(session, [sql.Query(("test-text", 4), lambda: text("SELECT 1"), {}), divide])
    for _ in range(3):  # (the pool hands the connection back: the name is prepared there, and known)
        with tenant_session(tenant_id) as session:
            assert sql.run(session, divide._replace(values={"d": 5})) == [(2,)]


def test_when_psycopg_drops_every_prepared_statement_the_generic_ones_are_prepared_again(stack):
    """psycopg sends ``DEALLOCATE ALL`` at a rollback once it has prepared statements of its own: engram's
    go too, and the connection prepares them again at their next use instead of naming one that is gone."""
    from sqlalchemy.orm import Session

    from core.db import get_engine

    query = sql.Query("test-generic-again", lambda: text("SELECT CAST(:v AS int) * 2"), {"v": 21}, generic=True)
    with get_engine().connect() as connection, Session(bind=connection) as session:
        driver = connection.connection.driver_connection
        known = lambda: {name.decode() for name in driver.prepared_statements}  # noqa: E731
        # (A pooled connection may also hold statements that failed in an earlier test: stale, to be closed.)
        stale = lambda: {name.decode() for name in driver.stale_statements}  # noqa: E731
        assert sql.run(session, query) == [(42,)]
        assert known() and known() | stale() == set(_prepared(driver))  # what it knows is what the server holds
        driver.execute("SELECT 1", prepare=True)  # one of psycopg's own
        session.rollback()
        assert not known() and not stale() and not _prepared(driver)
        assert sql.run(session, query) == [(42,)]
        assert len(known()) == 1 and known() == set(_prepared(driver))
        session.rollback()


def test_what_fails_beside_a_pipelined_call_leaves_the_statements_it_prepared_known(stack):
    """What runs while a call's statements are out (``meanwhile``: a search's full-text channel) may raise: the
    statements the call prepared are still noted, so their next use runs them instead of preparing again a name
    the server holds ("prepared statement already exists", for as long as the connection lives)."""
    from sqlalchemy.orm import Session

    from core.db import get_engine

    query = sql.Query("test-generic-beside", lambda: text("SELECT CAST(:v AS int) + 1"), {"v": 1}, generic=True)

    def fails() -> None:
        raise RuntimeError("beside the statements")

    with get_engine().connect() as connection, Session(bind=connection) as session:
        driver = connection.connection.driver_connection
        with pytest.raises(RuntimeError, match="beside the statements"):
            sql.run_many(session, [query], meanwhile=fails)
        assert sql.run(session, query._replace(values={"v": 2})) == [(3,)]
        known = {name.decode() for name in driver.prepared_statements | driver.stale_statements}
        assert known == set(_prepared(driver))
        session.rollback()


def test_a_generic_statement_whose_result_type_changed_is_prepared_afresh(stack):
    """A migration that changes what a prepared statement returns makes PostgreSQL refuse its cached plan
    ("cached plan must not change result type"): that call fails, and the next one closes the statement and
    prepares it again instead of failing the same way for as long as the connection lives."""
    from sqlalchemy.orm import Session

    from core.db import get_engine

    def ddl(driver, statements):  # type: ignore[no-untyped-def]
        # Straight to the server, by-passing psycopg (which would deallocate everything after an ALTER).
        sql.send(driver, statements)
        sql.receive(driver)

    query = sql.Query(
        "test-generic-shape", lambda: text("SELECT * FROM engram_test_shape WHERE id = :id"), {"id": 1}, generic=True
    )
    with get_engine().connect() as connection:
        driver = connection.connection.driver_connection
        stale_before = set(driver.stale_statements)  # (a pooled connection's, failed in earlier tests)
        ddl(
            driver,
            "CREATE TEMP TABLE engram_test_shape (id int, a text); INSERT INTO engram_test_shape VALUES (1, 'x')",
        )
        with Session(bind=connection) as session:
            assert sql.run(session, query) == [(1, "x")]
            session.commit()
            ddl(driver, "ALTER TABLE engram_test_shape ADD COLUMN b text DEFAULT 'y'")
            with pytest.raises(psycopg.errors.FeatureNotSupported):
                sql.run(session, query)
            session.rollback()
            for _ in range(2):
                assert sql.run(session, query) == [(1, "x", "y")]
            known = {name.decode() for name in driver.prepared_statements | driver.stale_statements}
            assert known == set(_prepared(driver)) and driver.stale_statements == stale_before
            session.rollback()
        ddl(driver, "DROP TABLE engram_test_shape")


def _tenant_query() -> sql.Query:
    """The tenant the transaction runs for, and a generic statement reading it."""
    return sql.Query("test-tenant", lambda: text("SELECT current_setting('engram.tenant_id', true)"), {}, generic=True)


def test_a_transaction_begun_for_a_driver_call_opens_in_its_round_trip(client, tenant):
    """When a core.sql call begins the session's transaction, the BEGIN and the tenant go out with its
    statements: nothing is sent when the connection is taken, and the statements see the tenant."""
    from psycopg import pq

    from core.dbwaits import opening_deferred

    with tenant_session(tenant.tenant_id) as session:
        with opening_deferred() as opening:
            driver = session.connection().connection.driver_connection
        assert driver.pgconn.transaction_status == pq.TransactionStatus.IDLE  # nothing sent yet
        ((begin, tenant_setting),) = [each.statements() for each in opening]
        assert begin.startswith("BEGIN") and str(tenant.tenant_id) in tenant_setting
        session.rollback()
    with tenant_session(tenant.tenant_id) as session:
        assert sql.run(session, _tenant_query()) == [(str(tenant.tenant_id),)]
        driver = session.connection().connection.driver_connection
        assert driver.pgconn.transaction_status == pq.TransactionStatus.INTRANS
        # A later statement of the same transaction is sent as usual, in it.
        assert session.execute(text("SELECT current_setting('engram.tenant_id', true)")).scalar() == str(
            tenant.tenant_id
        )


def test_a_value_refused_before_sending_still_opens_the_transaction(client, tenant):
    """A call that fails before sending anything (a value PostgreSQL cannot take) leaves the transaction it
    began opened, with its tenant, as it would have been without the deferral."""
    from psycopg import pq

    bad = sql.Query("test-bad", lambda: text("SELECT CAST(:v AS text)"), {"v": "nul \x00 inside"}, generic=True)
    with tenant_session(tenant.tenant_id) as session:
        with pytest.raises(psycopg.DataError):
            sql.run(session, bad)
        driver = session.connection().connection.driver_connection
        assert driver.pgconn.transaction_status == pq.TransactionStatus.INTRANS
        assert sql.run(session, _tenant_query()) == [(str(tenant.tenant_id),)]


def test_a_call_that_commits_ends_the_transaction_in_its_round_trip(client, tenant):
    """``commit=True``: the COMMIT goes with the statements; the session is committed (what it wrote is
    there for others) and its next statement begins a new transaction, for the same tenant."""
    memory_id = save(client, tenant, {"content": "counted once"})
    tenant_id = tenant.tenant_id

    def build():  # type: ignore[no-untyped-def]
        return text(
            "UPDATE memories SET access_count = access_count + 1 WHERE tenant_id = :t AND id = :id "
            "RETURNING access_count"
        )

    bump = sql.Query("test-bump", build, {"t": tenant_id, "id": memory_id}, generic=True)
    with tenant_session(tenant_id) as session:
        assert sql.run(session, bump, commit=True) == [(1,)]
        assert not session.in_transaction()
        with tenant_session(tenant_id) as other:  # committed: another transaction reads it
            assert (
                other.execute(text("SELECT access_count FROM memories WHERE id = :id"), {"id": memory_id}).scalar() == 1
            )
        assert sql.run(session, _tenant_query()) == [(str(tenant_id),)]
        session.rollback()
    # A call that fails commits nothing: the statement's error is raised and the transaction rolled back.
    failing = sql.Query("test-fail", lambda: text("SELECT 1 / (:zero - :zero)"), {"zero": 0}, generic=True)
    with pytest.raises(psycopg.errors.DivisionByZero):
        with tenant_session(tenant_id) as session:
            sql.run_many(session, [bump, failing], commit=True)
    with tenant_session(tenant_id) as session:
        assert (
            session.execute(text("SELECT access_count FROM memories WHERE id = :id"), {"id": memory_id}).scalar() == 1
        )


def test_a_plain_call_that_begins_the_transaction_leads_its_simple_query_with_the_opening(client, tenant):
    """A call of statements planned for their values (one simple query) carries the opening at its head: the
    statements see the tenant, and the session's snapshot level (read_one_snapshot) is the transaction's."""
    from psycopg import pq

    from core.db import read_one_snapshot

    plain = sql.Query(
        "test-plain",
        lambda: text("SELECT current_setting('engram.tenant_id', true), current_setting('transaction_isolation')"),
        {},
    )
    with tenant_session(tenant.tenant_id) as session:
        assert sql.run(session, plain) == [(str(tenant.tenant_id), "read committed")]
    with tenant_session(tenant.tenant_id) as session:
        read_one_snapshot(session)
        driver = session.connection().connection.driver_connection
        assert driver.pgconn.transaction_status == pq.TransactionStatus.INTRANS  # begun on its own
        assert sql.run(session, plain) == [(str(tenant.tenant_id), "repeatable read")]
    with tenant_session(tenant.tenant_id) as session:
        read_one_snapshot(session)
        assert sql.run(session, plain) == [(str(tenant.tenant_id), "repeatable read")]
        session.rollback()  # the level holds for the session's next transaction too
        assert sql.run(session, plain) == [(str(tenant.tenant_id), "repeatable read")]
    bad = sql.Query("test-plain-bad", lambda: text("SELECT CAST(:v AS text)"), {"v": object()})
    with tenant_session(tenant.tenant_id) as session:
        with pytest.raises(Exception):  # noqa: B017,PT011 - refused by psycopg's dumpers before sending
            sql.run(session, bad)
        driver = session.connection().connection.driver_connection
        assert driver.pgconn.transaction_status == pq.TransactionStatus.INTRANS
        assert sql.run(session, plain) == [(str(tenant.tenant_id), "read committed")]


def test_a_search_reads_one_snapshot_opened_with_its_first_statement(client, tenant, monkeypatch):
    """A search's transaction is REPEATABLE READ, and its BEGIN goes with its first statement: the opening is
    never sent on its own (core.db's run_simple, its round trip when no statement takes it)."""
    import core.db
    from core.search import service
    from core.search.schemas import SearchRequest
    from core.tenancy.context import Caller

    save(client, tenant, {"content": "the orders table keeps amounts in cents"})
    client.post("/v1/search", json={"question": "orders amounts"}, headers=tenant.headers())  # warm: index open
    caller = Caller(tenant_id=tenant.tenant_id, tenant_name=tenant.name, user="u", role="admin", key_id="k")
    # Recorded from this thread only, where the searches run (threads of other tests may run meanwhile).
    here = threading.get_ident()
    alone: list[str] = []
    real = core.db.run_simple

    def run_simple(driver, statement):  # type: ignore[no-untyped-def]
        if threading.get_ident() == here:
            alone.append(statement)
        return real(driver, statement)

    openings: list[str] = []  # what each core.sql call opened its transaction with
    exchange = sql._exchange

    def opened(driver, queries, meanwhile, opening, commit):  # type: ignore[no-untyped-def]
        if threading.get_ident() == here:
            openings.extend(statement for each in opening for statement in each.statements())
        return exchange(driver, queries, meanwhile, opening, commit)

    monkeypatch.setattr(core.db, "run_simple", run_simple)
    monkeypatch.setattr(sql, "_exchange", opened)
    for request in (SearchRequest(question="orders amounts"), SearchRequest(question="orders", entities=["x.y"])):
        with tenant_session(tenant.tenant_id) as session:
            response = service.search(session, caller=caller, request=request)
        assert response.memories
    assert alone == []
    begun = [opening for opening in openings if opening.startswith("BEGIN")]
    assert len(begun) == 2 and all(opening == "BEGIN ISOLATION LEVEL REPEATABLE READ" for opening in begun), begun
    with tenant_session(tenant.tenant_id) as session:  # (what is counted: a transaction begun by the ORM)
        session.execute(text("SELECT 1"))
    assert len(alone) == 1 and alone[0].startswith("BEGIN")


def test_a_unit_of_work_whose_statement_committed_is_not_committed_again(client, tenant):
    """tenant_session commits what is left to commit: after a call that carried the COMMIT, nothing (its
    commit hooks ran once, with that commit); a unit of work with a transaction open is committed as ever."""
    from sqlalchemy.orm import Session

    commits: list[int] = []

    def counted(session: Session) -> None:
        commits.append(session.info["tenant_id"])

    with listening(Session, after_commit=counted):
        with tenant_session(tenant.tenant_id) as session:
            sql.run(session, _tenant_query(), commit=True)
        assert commits == [tenant.tenant_id]
        with tenant_session(tenant.tenant_id) as session:
            sql.run(session, _tenant_query())
            assert session.in_transaction()
        assert commits == [tenant.tenant_id] * 2


@pytest.mark.parametrize("mode", ["recent", "important", "typed"])
def test_an_ordered_search_reads_its_buckets_and_their_hits_in_one_round_trip(client, tenant, mode):
    """The ordered modes read both buckets, with the columns their hits show, in one core.sql call: no ORM
    statement, no query of the hits' own."""
    from sqlalchemy.orm import Session

    from core.search import service
    from core.search.schemas import SearchRequest
    from core.tenancy.context import Caller

    plain = save(client, tenant, {"content": "a plain note on invoices", "kind": "fact", "importance": 0.2})
    weighty = save(client, tenant, {"content": "the weightier note on invoices", "kind": "fact", "importance": 0.9})
    query = {"source_model": "shop.orders", "dimensions": ["status"]}
    example = save(client, tenant, {"content": "orders by status", "kind": "fact", "linked_entities": query})
    caller = Caller(tenant_id=tenant.tenant_id, tenant_name=tenant.name, user="u", role="admin", key_id="k")
    calls: list[list[object]] = []
    orm: list[object] = []
    real = sql._exchange
    here = threading.get_ident()  # (the search runs in this thread; other tests' threads may run meanwhile)

    def through_the_orm(state: Any) -> None:
        if threading.get_ident() == here:
            orm.append(state)

    def exchange(driver, queries, *rest):  # type: ignore[no-untyped-def]
        if threading.get_ident() == here:
            calls.append([q.key[0] for q in queries])
        return real(driver, queries, *rest)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sql, "_exchange", exchange)
        with listening(Session, do_orm_execute=through_the_orm):
            with tenant_session(tenant.tenant_id) as session:
                request = SearchRequest(mode=mode, kind="fact" if mode == "typed" else None)
                response = service.search(session, caller=caller, request=request)
    # (The catalog's snapshot is read after them, for the example queries' stale-entity warnings.)
    assert calls[0] == ["ordered", "ordered"] and not any("hits" in keys for keys in calls) and orm == []
    # Newest first, or weightiest first: the same order here, and the hits' text read with their ids.
    assert [hit.id for hit in response.memories] == [weighty, plain]
    assert "the weightier note on invoices" in response.memories[0].text and response.memories[0].importance == 0.9
    assert [hit.id for hit in response.example_queries] == [example]
    assert "orders by status" in response.example_queries[0].text and response.example_queries[0].query


def test_a_search_reads_no_numeric_columns(client, catalog, monkeypatch):
    """What a search reads comes back as ints, floats and text: a numeric column (a sum of bigints is one) is
    read as a Decimal, built from its text for every row, and the entity channel's corpus statistics ride on
    every candidate row."""
    from decimal import Decimal

    for n in range(3):
        save(client, catalog, {"content": f"amount note {n} in cents", "linked_entities": ["shop.orders.amount"]})
    read: list[tuple[str, type]] = []
    exchange = sql._exchange

    def watched(driver, queries, *args):  # type: ignore[no-untyped-def]
        results = exchange(driver, queries, *args)
        read.extend(
            (str(q.key), type(v)) for q, rows in zip(queries, results, strict=True) for row in rows for v in row
        )
        return results

    monkeypatch.setattr(sql, "_exchange", watched)
    body = {"entities": ["shop.orders.amount"], "question": "order amount in cents"}
    response = client.post("/v1/search", json=body, headers=catalog.headers())
    assert response.status_code == 200, response.text
    assert len(response.json()["memories"]) == 3
    assert {key.split(",")[0] for key, _ in read} >= {"head", "('entity_bm25'"}
    assert [key for key, kind in read if kind is Decimal] == []


def test_each_result_on_a_connection_loads_by_its_own_column_types(client, tenant):
    """The connection's row loader (kept for its life) loads every result by that result's own types: the
    same column positions holding other types from one call to the next, generic or not."""
    shapes = [
        ("test-types-a", "SELECT CAST(:n AS bigint), CAST(:t AS text), :b", {"n": 7, "t": "x", "b": True}),
        ("test-types-b", "SELECT CAST(:t AS text), :f, CAST(:n AS bigint)", {"t": "7", "f": 2.5, "n": 3}),
    ]
    expected = {"test-types-a": [(7, "x", True)], "test-types-b": [("7", 2.5, 3)]}
    with tenant_session(tenant.tenant_id) as session:
        for generic in (True, False, True):
            for name, statement, values in shapes:
                query = sql.Query((name, generic), lambda s=statement: text(s), values, generic=generic)  # type: ignore[misc]
                assert [tuple(row) for row in sql.run(session, query)] == expected[name]


def test_a_connection_sends_and_reads_in_its_own_client_encoding(stack):
    """An engram connection keeps the client encoding it opened with (read once for its life): values go out
    and come back in it, on the pipelined path (generic statements) and the simple one."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.orm import Session
    from sqlalchemy.pool import NullPool

    from core.db import _connect_bounded, app_database_url
    from core.dbwaits import BoundedConnection

    engine = create_engine(
        app_database_url(), poolclass=NullPool, connect_args={"options": "-c client_encoding=LATIN1"}
    )
    event.listen(engine, "do_connect", _connect_bounded)
    try:
        with engine.connect() as connection, Session(bind=connection) as session:
            driver = connection.connection.driver_connection
            assert isinstance(driver, BoundedConnection)
            assert driver.encoding == driver.info.encoding == "iso8859-1"
            for generic in (True, False):
                query = sql.Query(
                    ("test-latin1", generic),
                    lambda: text("SELECT CAST(:t AS text) || 'ü'"),
                    {"t": "café"},
                    generic=generic,
                )
                assert [tuple(row) for row in sql.run(session, query)] == [("caféü",)]
            session.rollback()
    finally:
        engine.dispose()
