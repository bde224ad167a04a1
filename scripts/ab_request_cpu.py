"""A/B of a request's CPU in the API process between two source trees, interleaved finely in one sitting.

    python scripts/ab_request_cpu.py /path/to/main /path/to/branch

Both trees' `engram api` run side by side on one throwaway stack (embedded PostgreSQL and Redis; the trees
must share the schema), each with its own tenant of `--memories` memories. Each round sends `--calls` gets
by id and `--calls` saves to each API in turn (the order alternating), on one keep-alive client per API,
and reads each API process's CPU from /proc around them: both trees meet the same load of the shared
machine, so the ratio holds even while its speed moves. Prints each round and the medians per tree and op.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


def _start(tree: str, stack: Any, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **stack.env, "PYTHONPATH": tree}
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "api.cli", "api", "--port", str(port), "--no-migrate"],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs=2)
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    from api.bench.load import cpu_seconds
    from api.bench.stack import bench_stack, wait_healthy
    from api.serve.embedded import free_port
    from core.db import system_session
    from core.tenancy.service import create_tenant

    with bench_stack() as stack:
        processes: list[subprocess.Popen[bytes]] = []
        clients: list[httpx.Client] = []
        try:
            targets = []
            for n, tree in enumerate(args.trees):
                with system_session() as session:
                    key = create_tenant(session, name=f"ab{n}").api_key
                port = free_port()
                process = _start(tree, stack, port, stack.home / f"api{n}.log")
                processes.append(process)
                url = f"http://127.0.0.1:{port}"
                if not wait_healthy(url, process):
                    raise RuntimeError(f"the API at {url} did not start")
                http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
                clients.append(http)
                for start in range(0, args.memories, 1000):
                    items = [
                        {"content": f"note {i} about orders and invoices in region {i % 50}"}
                        for i in range(start, min(start + 1000, args.memories))
                    ]
                    http.post("/v1/memories:batch", json={"items": items}).raise_for_status()
                probe = http.get("/v1/memories", params={"limit": 1}).json()["memories"][0]["id"]

                def calls(http: httpx.Client = http, probe: str = probe) -> dict[str, Callable[[], Any]]:
                    return {
                        "get": lambda: http.get(f"/v1/memories/{probe}"),
                        "save": lambda: http.post("/v1/memories", json={"content": f"note {uuid.uuid4().hex}"}),
                    }

                targets.append((tree, process.pid, calls()))
                for call in calls().values():
                    for _ in range(100):
                        call().raise_for_status()
            figures: dict[tuple[str, str], list[float]] = {}
            for round_ in range(args.rounds):
                order = targets if round_ % 2 == 0 else targets[::-1]
                for tree, pid, requests in order:
                    for op, call in requests.items():
                        before = cpu_seconds([pid])
                        for _ in range(args.calls):
                            call()
                        ms = (cpu_seconds([pid]) - before) * 1000 / args.calls
                        figures.setdefault((tree, op), []).append(ms)
                        print(json.dumps({"round": round_, "tree": tree, "op": op, "api_cpu_ms": round(ms, 3)}))
            for op in ("get", "save"):
                medians = [statistics.median(figures[(tree, op)]) for tree in args.trees]
                print(
                    json.dumps(
                        {
                            "op": op,
                            **{f"median_ms {tree}": round(m, 3) for tree, m in zip(args.trees, medians, strict=True)},
                            "ratio": round(medians[1] / medians[0], 3),
                        }
                    )
                )
        finally:
            for http in clients:
                http.close()
            for process in processes:
                process.terminate()
                process.wait(timeout=30)


if __name__ == "__main__":
    main()
