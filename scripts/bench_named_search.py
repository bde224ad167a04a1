"""Entity searches naming one memory (`entities: ["memory:<id>"]`), with the named memories read with the head
(core.search.service.NAMED_AHEAD on) and before it (off), in alternation in one process.

On a throwaway stack (api.bench.stack), `--anchors` memories are each named by `--memories / --anchors` others
(`linked_entities`); each round runs `--calls` searches through the app in-process (the test client's CPU
included) with the switch off, then on (every other round on, then off). Printed per setting: the process's CPU
per search (`time.process_time`) and the wall p50 of each round, and their medians.

    python scripts/bench_named_search.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--anchors", type=int, default=20)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.bench.stack import bench_stack
    from core.db import system_session
    from core.search import service
    from core.tenancy.service import create_tenant

    with bench_stack(), TestClient(create_app()) as client:
        with system_session() as session:
            headers = {"Authorization": f"Bearer {create_tenant(session, name='bench').api_key}"}
        anchors = [
            client.post("/v1/memories", json={"content": f"anchor {n}"}, headers=headers).json()["memory_id"]
            for n in range(args.anchors)
        ]
        items = [
            {"content": f"note {n}", "linked_entities": [f"memory:{anchors[n % args.anchors]}"]}
            for n in range(args.memories)
        ]
        for start in range(0, len(items), 500):
            answer = client.post("/v1/memories:batch", json={"items": items[start : start + 500]}, headers=headers)
            assert answer.status_code == 200, answer.text

        def run(ahead: bool, calls: int) -> tuple[float, float]:
            service.NAMED_AHEAD = ahead
            cpu, walls = 0.0, []
            for n in range(calls):
                body = {"entities": [f"memory:{anchors[n % args.anchors]}"]}
                started, cpu_started = time.perf_counter(), time.process_time()
                response = client.post("/v1/search", json=body, headers=headers)
                assert response.status_code == 200, response.text
                cpu += time.process_time() - cpu_started
                walls.append(time.perf_counter() - started)
            return cpu * 1000 / calls, statistics.median(walls) * 1000

        run(True, 100)
        run(False, 100)
        figures: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for round_ in range(args.rounds):
            for ahead in (False, True) if round_ % 2 == 0 else (True, False):
                figures[ahead].append(run(ahead, args.calls))
        for ahead, rounds in figures.items():
            cpu = [c for c, _ in rounds]
            wall = [w for _, w in rounds]
            print(
                json.dumps(
                    {
                        "named_ahead": ahead,
                        "cpu_ms": [round(c, 3) for c in cpu],
                        "wall_p50_ms": [round(w, 3) for w in wall],
                        "cpu_median_ms": round(statistics.median(cpu), 3),
                        "wall_median_ms": round(statistics.median(wall), 3),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
