"""Markdown export and import (CONTRACT section 4): the block format, and lossless round trips on the stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import Invalid
from core.memories.transfer import escape_content, parse_markdown, render_markdown, unescape_content
from tests.helpers.catalog import create_and_ingest, sqlite_source

REPO = Path(__file__).resolve().parents[3]

# Every field an import restores; created_at and the owner are the importer's.
RESTORED = (
    "id",
    "content",
    "kind",
    "category",
    "importance",
    "occurred_at",
    "tags",
    "entities",
    "associations",
    "source",
    "run_id",
    "persona",
    "agent_id",
    "query",
)

TRICKY_CONTENTS = [
    "plain",
    "---",
    "before\n---\nafter",
    "\\---\n\\\\---\n---\r\n--- not a delimiter\n----",
    "ends with a newline\n",
    "ends with blank lines\n\n\n",
    "\nstarts with a newline",
    "unicode: 日本語 ✓ émoji 🧠, a line\u2028separator and a\x0bvertical tab",
    "key: looks like yaml\ntags: [x]",
    "x" * 49_000,
]


@pytest.mark.parametrize("content", TRICKY_CONTENTS)
def test_escape_is_reversible(content):
    """Escaping adds one backslash to lines of backslashes followed by '---'; unescaping removes it."""
    assert unescape_content(escape_content(content)) == content
    assert not any(line.rstrip("\r") == "---" for line in escape_content(content).split("\n"))


def test_render_parse_roundtrip_of_tricky_contents():
    """Blocks rendered back to back parse into the same contents, in order."""
    memories = [
        {"id": str(i), "content": c, "kind": "fact", "category": "core", "tags": [], "entities": []}
        for i, c in enumerate(TRICKY_CONTENTS)
    ]
    blocks = parse_markdown(render_markdown(memories))
    assert [b.content for b in blocks] == TRICKY_CONTENTS
    assert [b.front_matter["key"] for b in blocks] == [str(i) for i in range(len(TRICKY_CONTENTS))]


def test_front_matter_scalars_follow_yaml_12():
    """Hand-written ids like 0100 stay strings; yes/no stay strings; true/false and decimals are typed."""
    text = "---\nkey: 0100\ntags: [no, yes, on]\nimportance: 0.25\n---\nbody\n"
    (block,) = parse_markdown(text)
    assert block.front_matter == {"key": "0100", "tags": ["no", "yes", "on"], "importance": 0.25}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello\n---\nkey: a\n---\nbody", "line 1: expected '---'"),
        ("---\nkey: a\nbody without a closing delimiter", "block 1 (line 1): front matter is not closed"),
        ("---\nkey: [unclosed\n---\nbody", "block 1 (line 1): front matter is not valid YAML"),
        ("---\n- a list\n---\nbody", "block 1 (line 1): front matter must be a mapping"),
        ("---\nkey: a\n---\nx\n---\nkey: b\nlearnign: typo\n---\ny", "block 2 (line 5): unknown front-matter key"),
    ],
)
def test_malformed_markdown_names_the_block(text, message):
    with pytest.raises(Invalid) as raised:
        parse_markdown(text)
    assert message in raised.value.message


def _export(client, tenant, key=None, **params):  # type: ignore[no-untyped-def]
    response = client.get("/v1/memories:export", params={"format": "markdown", **params}, headers=tenant.headers(key))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/markdown")
    return response.text


def _import(client, tenant, text, *, as_json=False, expect=200):  # type: ignore[no-untyped-def]
    if as_json:
        response = client.post("/v1/memories:import", json={"markdown": text}, headers=tenant.headers())
    else:
        headers = {**tenant.headers(), "Content-Type": "text/markdown; charset=utf-8"}
        response = client.post("/v1/memories:import", content=text.encode(), headers=headers)
    assert response.status_code == expect, response.text
    return response.json()


def _all(client, tenant):  # type: ignore[no-untyped-def]
    memories = []
    for status in ("active", "stale"):
        response = client.get("/v1/memories", params={"limit": 200, "status": status}, headers=tenant.headers())
        memories += response.json()["memories"]
    return {m["id"]: {f: m[f] for f in RESTORED} for m in memories}


def _without_record_times(markdown: str) -> str:
    """The export minus created_at / updated_at, which record the import itself."""
    return "\n".join(line for line in markdown.split("\n") if not line.startswith(("created_at: ", "updated_at: ")))


def _save(client, tenant, body):  # type: ignore[no-untyped-def]
    response = client.post("/v1/memories", json=body, headers=tenant.headers())
    assert response.status_code == 201, response.text
    return response.json()["memory_id"]


def test_export_import_into_a_fresh_tenant_is_lossless(client, make_tenant, tmp_path):
    """Every restored field survives, including catalog and memory entities, forward associations, event
    times, unicode, '---' lines, empty tags and long content; ids keep their order and the allocator
    continues after them."""
    source, target = make_tenant(), make_tenant()
    with sqlite_source(tmp_path) as (url, schema):
        for tenant in (source, target):
            create_and_ingest(client, tenant, url=url, schema=schema)
    first = _save(client, source, {"content": "first", "kind": "identity", "tags": [], "category": "core"})
    bodies = [
        {"content": content, "tags": ["t1", "ü"] if i % 2 else [], "kind": "event", "category": "workspace"}
        for i, content in enumerate(TRICKY_CONTENTS)
    ]
    ids = [_save(client, source, body) for body in bodies]
    _save(
        client,
        source,
        {
            "id": "kb.policy-42",
            "content": "amount is in cents",
            "linked_entities": ["shop.orders.amount", f"memory:{first}"],
            "occurred_at": "2021-03-04T05:06:07+00:00",
            "importance": 0.33,
            "source": "user stated explicitly",
            "run_id": "run-7",
            "persona": "analyst",
            "agent_id": "agent-a",
            "category": "daily",
            "associations": [{"target_id": first, "relation_type": "caused_by", "weight": 0.9}],
        },
    )
    _save(
        client,
        source,
        {"content": "Total paid revenue", "linked_entities": {"source_model": "orders", "measures": ["amount:sum"]}},
    )
    # The oldest memory points at newer ones, so the import meets those targets later in the file.
    patched = client.patch(
        f"/v1/memories/{first}",
        json={
            "linked_entities": ["memory:kb.policy-42"],
            "associations": [{"target_id": ids[-1], "relation_type": "related_to"}],
        },
        headers=source.headers(),
    )
    assert patched.status_code == 200, patched.text
    markdown = _export(client, source)
    assert markdown.startswith("---\nkey: '1'\n")
    result = _import(client, target, markdown)
    assert result["imported"] == len(bodies) + 3
    before, after = _all(client, source), _all(client, target)
    assert after == before
    assert after[first]["associations"] == [{"target_id": ids[-1], "relation_type": "related_to", "weight": 0.5}]
    assert "memory:kb.policy-42" in after[first]["entities"]
    assert _without_record_times(_export(client, target)) == _without_record_times(markdown)
    assert _save(client, target, {"content": "next"}) == str(len(bodies) + 3)


def test_json_body_and_reimport_upserts(client, tenant):
    """The JSON form {"markdown": ...} works; importing twice upserts the same ids."""
    _save(client, tenant, {"content": "a note", "tags": ["x"]})
    markdown = _export(client, tenant)
    assert _import(client, tenant, markdown, as_json=True)["memory_ids"] == ["1"]
    assert _import(client, tenant, markdown)["memory_ids"] == ["1"]
    assert list(_all(client, tenant)) == ["1"]


def test_export_respects_visibility_and_skips_forgotten(client, tenant, member_key):
    """A member exports what it sees (its agent's memories, shared ones); forgotten memories never."""
    member = member_key()
    _save(client, tenant, {"content": "agent b only", "agent_id": "b"})
    _save(client, tenant, {"content": "shared"})
    gone = _save(client, tenant, {"content": "forgotten"})
    assert client.delete(f"/v1/memories/{gone}", headers=tenant.headers()).status_code == 200
    mine = _export(client, tenant, key=member, agent_id="a")
    assert "shared" in mine and "agent b only" not in mine and "forgotten" not in mine
    assert "agent b only" in _export(client, tenant, key=member, agent_id="b")


def test_import_is_one_transaction_and_errors_name_the_block(client, tenant):
    """A bad block fails the whole import with a 4xx naming it; nothing of the file is saved."""
    good = "---\nkey: ok-1\n---\nfine\n"
    cases = [
        ("---\nkey: bad\nkind: nonsense\n---\nx\n", 422, "blocks.1.kind"),
        ("---\nkey: bad\n---\n" + "x" * 50_001 + "\n", 413, "blocks.1.content"),
        ("---\nkey: a/b\n---\nx\n", 422, "blocks.1.key"),
        ("---\nkey: bad\nentities: [nowhere.table]\n---\nx\n", 422, "blocks.1.entities.0"),
        ("---\nkey: bad\nassociations: [{target_id: missing}]\n---\nx\n", 422, "blocks.1.associations.0.target_id"),
        ("---\nkey: bad\n---\n\n", 422, "blocks.1.content"),
    ]
    for bad, status, field in cases:
        body = _import(client, tenant, good + bad, expect=status)
        assert body["error"]["field"] == field, body
        assert body["error"]["message"].startswith("block 2 (line 5, key '"), body
    assert _all(client, tenant) == {}


def test_import_and_export_bad_requests(client, tenant):
    """Wrong media type 415, empty or non-markdown bodies 422, bad UTF-8 400, unknown format 422, no key 401."""
    headers = tenant.headers()
    assert (
        client.post("/v1/memories:import", content=b"x", headers={**headers, "Content-Type": "image/png"}).status_code
        == 415
    )
    assert client.post("/v1/memories:import", json={"markdown": "  "}, headers=headers).status_code == 422
    assert client.post("/v1/memories:import", json={"text": "x"}, headers=headers).status_code == 422
    bad_utf8 = {**headers, "Content-Type": "text/markdown"}
    assert client.post("/v1/memories:import", content=b"---\n---\n\xff\n", headers=bad_utf8).status_code == 400
    response = client.get("/v1/memories:export", params={"format": "csv"}, headers=headers)
    assert response.status_code == 422 and response.json()["error"]["field"] == "format"
    assert client.get("/v1/memories:export").status_code == 401
    assert (
        client.post(
            "/v1/memories:import", content=b"---\n---\nx", headers={"Content-Type": "text/markdown"}
        ).status_code
        == 401
    )


def test_cli_export_and_import(api_url, make_tenant, tmp_path):  # noqa: F811
    """`engram memory export --output FILE` then `engram memory import FILE` into another tenant; carriage
    returns and '---' lines survive the file."""
    source, target = make_tenant(), make_tenant()
    env = {**os.environ, "ENGRAM_URL": api_url}

    def engram(key: str, *args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "api.cli", "memory", "--api-key", key, *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result

    engram(source.admin_key, "save", "line one\r\n---\r\nline three", "--tag", "cli", "--id", "cli-1")
    path = tmp_path / "export.md"
    assert "exported 1 memories" in engram(source.admin_key, "export", "--output", str(path)).stderr
    assert "\\---\r\n" in path.read_bytes().decode()
    assert "imported 1 memories" in engram(target.admin_key, "import", str(path)).stdout
    shown = json.loads(engram(target.admin_key, "get", "cli-1", "--format", "json").stdout)
    assert shown["content"] == "line one\r\n---\r\nline three" and shown["tags"] == ["cli"]
    listed = json.loads(engram(target.admin_key, "list", "--format", "json").stdout)
    assert [m["id"] for m in listed["memories"]] == ["cli-1"]
