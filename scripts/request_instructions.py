"""Instructions a request costs the API, counted by callgrind: an A/B of source trees that the machine's load
does not move (CPU time on a shared machine moves by 2x within a day; an instruction count by well under 1%).

    python scripts/request_instructions.py /path/to/main /path/to/branch --ops get save get404

One throwaway stack (embedded PostgreSQL and Redis). For each tree and op, a child process builds that tree's
app in-process (no uvicorn, no sockets: the ASGI app driven by hand on uvloop), makes its own tenant of
`--memories` memories, warms up, and sends `--calls` requests under `valgrind --tool=callgrind` with
instrumentation switched on only around them (`callgrind_control`); the figure is the instructions of every
thread of the process per request: the app's middleware, routing, authentication, the request thread's hop,
the tenant transaction, the route's work, serialisation, the access log and metrics. What it cannot see is
what a request costs in the kernel (system calls, thread switches) and in cache misses: count system calls
apart (`strace -c -f -p <engram api pid>`) and confirm with `scripts/ab_request_cpu.py`.

Ops: `get` (GET /v1/memories/{id}), `save` (POST /v1/memories), `patch` (PATCH /v1/memories/{id}, new
content), `forget` (DELETE /v1/memories/{id}, each of another memory), `get404` (GET /v1/memories/{bad id}: the
whole keyed path without a statement), `healthz`, and `search` (POST /v1/search, hybrid: a question and two
entities, the generated requests of `engram bench search` in turn, on its corpus of `--memories` memories
linked to `--entities` catalog entities, embedded; built once for both trees). The key's rate limit is off (its
lease from Redis depends on the request rate, which valgrind slows 50-fold) and PYTHONHASHSEED fixed, so runs
repeat to ~0.5%. `--keep DIR` keeps each run's profile for `callgrind_annotate`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import uvloop

_HEADERS = [(b"host", b"127.0.0.1"), (b"accept", b"*/*"), (b"user-agent", b"engram-bench")]


async def _call(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> Any:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": method,
        "root_path": "",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [*_HEADERS, *headers]
        + ([(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")] if body else []),
        "state": {},
    }
    delivered = False
    answer: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        else:
            answer["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return answer


def _toggle(on: bool) -> None:
    command = ["callgrind_control", "-i", "on" if on else "off", str(os.getpid())]
    subprocess.run(command, check=True, capture_output=True)


async def _child(op: str, memories: int, calls: int) -> None:
    import gc

    from api.app import create_app
    from core.db import system_session
    from core.logging import configure_logging
    from core.tenancy.service import create_tenant

    configure_logging(process="api", stream=open(os.devnull, "w"), json_lines=True)  # noqa: SIM115
    searches = json.loads(os.environ.get("INSTRUCTIONS_SEARCHES", "[]"))
    key = os.environ.get("INSTRUCTIONS_SEARCH_KEY") if op == "search" else None
    if key is None:
        with system_session() as session:
            key = create_tenant(session, name=f"instructions-{uuid.uuid4().hex[:8]}").api_key
    app = create_app()
    gc.collect()
    gc.freeze()  # as api.main does
    auth = [(b"authorization", f"Bearer {key}".encode())]
    ids: list[str] = []
    for start in range(0, 0 if op == "search" else memories, 1000):  # (the search's corpus is made by the parent)
        notes = range(start, start + 1000)
        items = [{"content": f"note {i} about orders and invoices in region {i % 50}"} for i in notes]
        saved = await _call(app, "POST", "/v1/memories:batch", auth, json.dumps({"items": items}).encode())
        ids += [result["memory_id"] for result in json.loads(saved["body"])["results"]]
    first = ids[0] if ids else ""
    forgotten = iter(ids[1:])  # (a forget needs a memory not forgotten yet: --memories above 50 + --calls)
    asked = iter(searches)  # (the parent made one for each call and warm-up)
    requests = {
        "get": lambda: _call(app, "GET", f"/v1/memories/{first}", auth),
        "save": lambda: _call(
            app, "POST", "/v1/memories", auth, json.dumps({"content": f"note {uuid.uuid4().hex}"}).encode()
        ),
        "patch": lambda: _call(
            app, "PATCH", f"/v1/memories/{first}", auth, json.dumps({"content": f"note {uuid.uuid4().hex}"}).encode()
        ),
        "forget": lambda: _call(app, "DELETE", f"/v1/memories/{next(forgotten)}", auth),
        "get404": lambda: _call(app, "GET", "/v1/memories/a:b", auth),
        "healthz": lambda: _call(app, "GET", "/healthz", []),
        "search": lambda: _call(app, "POST", "/v1/search", auth, json.dumps(next(asked)).encode()),
    }
    request = requests[op]
    for _ in range(50):
        status = (await request())["status"]
    if op == "search" and status != 200:
        raise SystemExit(f"search answered {status}: the figure would not be a search's")
    _toggle(True)
    for _ in range(calls):
        await request()
    _toggle(False)
    print(json.dumps({"status": status}))


def _search_corpus(memories: int, entities: int, calls: int) -> dict[str, str]:
    """The `search` op's tenant (`engram bench search`'s corpus), a key of it and the requests, for the children."""
    import base64
    import random

    from api.bench.search import MODES, build
    from core.config import reset_settings_cache
    from core.db import system_session
    from core.tenancy.models import Tenant
    from core.tenancy.service import issue_key

    os.environ.setdefault("ENGRAM_SECRET_KEY", base64.urlsafe_b64encode(os.urandom(32)).decode())
    reset_settings_cache()
    corpus = build(memories=memories, entities=entities, log=lambda message: print(message, file=sys.stderr))
    with system_session() as session:
        tenant = session.get(Tenant, corpus.tenant_id)
        key = issue_key(session, tenant=tenant, user="bench@localhost", role="admin").api_key
    rng = random.Random(11)
    searches = [MODES["hybrid"](corpus, rng) for _ in range(50 + calls)]
    return {
        "INSTRUCTIONS_SEARCH_KEY": key,
        "INSTRUCTIONS_SEARCHES": json.dumps(searches),
        "ENGRAM_SECRET_KEY": os.environ["ENGRAM_SECRET_KEY"],
    }


def _count(tree: str, op: str, args: argparse.Namespace, env: dict[str, str], log: Path) -> float:
    child_env = {**env, "PYTHONPATH": tree, "PYTHONHASHSEED": "0", "ENGRAM_RATE_LIMIT_PER_SECOND": "0"}
    command = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={log.with_suffix('.out')}",
        sys.executable, "-P", __file__, "--child", op, "--memories", str(args.memories), "--calls", str(args.calls),
    ]  # fmt: skip
    with log.open("wb") as out:
        subprocess.run(command, env=child_env, cwd=tree, stdout=out, stderr=subprocess.STDOUT, check=True)
    collected = re.search(r"Collected : (\d+)", log.read_text())
    if collected is None:
        raise RuntimeError(f"no count from callgrind: {log.read_text()[-2000:]}")
    return int(collected.group(1)) / args.calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*")
    parser.add_argument("--ops", nargs="+", default=["get", "save", "get404"])
    parser.add_argument("--memories", type=int, default=1000)
    parser.add_argument("--entities", type=int, default=1000, help="catalog entities of the `search` op's corpus")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--keep", help="copy each run's callgrind profile into this directory (callgrind_annotate)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        uvloop.run(_child(args.child, args.memories, args.calls))  # the loop `engram api` runs on
        return
    from api.bench.stack import bench_stack

    with bench_stack() as stack:
        env = {**os.environ, **stack.env}
        if "search" in args.ops:
            env.update(_search_corpus(args.memories, args.entities, args.calls))
        for round_ in range(args.rounds):
            for op in args.ops:
                for n, tree in enumerate(args.trees):
                    log = stack.home / f"callgrind-{n}-{op}.log"
                    per_request = _count(tree, op, args, env, log)
                    if args.keep:
                        Path(args.keep).mkdir(parents=True, exist_ok=True)
                        shutil.copy(log.with_suffix(".out"), Path(args.keep) / f"{round_}-{n}-{op}.out")
                    print(json.dumps({"round": round_, "tree": tree, "op": op, "instructions": round(per_request)}))


if __name__ == "__main__":
    main()
