"""Search CPU of two code trees, A/B in one sitting, on one generated tenant (and optionally LoCoMo conversations).

    python scripts/search_cpu_ab.py --a /work/main --b /work/wt-speed [--rounds 6] [--queries 60]
        [--memories 10000] [--entities 1000] [--locomo ../shared/bench/locomo/dev.json --conversations 3]

On shared cores a figure moves by 2x within an hour, so two runs one after the other compare badly. Here one
process (tree A) builds a throwaway stack and the corpus of `engram bench search` (and, with --locomo, the
first conversations as `engram eval retrieval --form content` loads them), then two warm worker processes, one
per tree, answer rounds of the same generated searches in turn (A then B, then B then A), and the CPU of the
searching process per call (time.process_time, the figure `engram bench search` prints as cpu_p50_ms) is
compared round by round. Both trees must share the database schema (the same migrations).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("hybrid", "question", "entities")


def hold(spec_path: Path, memories: int, entities: int, locomo: str | None, conversations: int) -> None:
    """Build the stack and corpus, write what the workers need to ``spec_path``, keep it all up until stopped."""
    import base64

    from api.bench.search import build
    from api.bench.stack import bench_stack
    from core.config import reset_settings_cache

    os.environ.setdefault("ENGRAM_SECRET_KEY", base64.urlsafe_b64encode(os.urandom(32)).decode())
    reset_settings_cache()
    with bench_stack() as stack:
        corpus = build(memories=memories, entities=entities, log=lambda m: print(m, file=sys.stderr))
        spec = {"env": {**stack.env, "ENGRAM_SECRET_KEY": os.environ["ENGRAM_SECRET_KEY"]}}
        spec |= {"tenant_id": corpus.tenant_id, "entity_ids": corpus.entity_ids, "conversations": []}
        if locomo:
            spec["conversations"] = _load_conversations(locomo, conversations)
        spec_path.write_text(json.dumps(spec))
        while not spec_path.with_suffix(".stop").exists():
            time.sleep(0.5)


def _load_conversations(path: str, count: int) -> list[dict]:
    from api.bench.retrieval import load_conversation
    from core.db import system_session
    from core.tenancy.service import create_tenant, get_tenant_by_name

    loaded = []
    for number, given in enumerate(json.loads(Path(path).read_text())["conversations"][:count], start=1):
        name = f"ab-conversation-{number}"
        with system_session() as session:
            create_tenant(session, name=name)
            tenant = get_tenant_by_name(session, name=name)
            assert tenant is not None
        load_conversation(tenant_id=tenant.id, conversation={**given, "conversation": name}, content_only=True)
        questions = [str(q.get("question") or "") for q in given["questions"] if q.get("gold")]
        loaded.append({"tenant_id": tenant.id, "questions": questions})
    return loaded


def work(spec_path: Path, home: str) -> None:
    """Answer 'MODE QUERIES SEED' lines with the CPU and wall p50 (ms) of that many searches."""
    spec = json.loads(spec_path.read_text())
    os.environ.update({**spec["env"], "ENGRAM_HOME": home})
    Path(home).mkdir(exist_ok=True)
    from api.bench.corpus import Corpus
    from api.bench.retrieval import ask
    from api.bench.search import measure_answers

    corpus = Corpus(tenant_id=spec["tenant_id"], entity_ids=spec["entity_ids"])
    questions = [(c["tenant_id"], q) for c in spec["conversations"] for q in c["questions"]]
    for mode in MODES:  # warm: the index opened and caught up, the matrix read, the facts loaded
        measure_answers(corpus, mode=mode, queries=20)
    for tenant_id in {t for t, _ in questions}:
        ask(tenant_id=tenant_id, question="warm up")
    print("ready", flush=True)
    for line in sys.stdin:
        mode, count, seed = line.split()
        if mode.startswith("answers:"):  # what the searches answered, for the trees' answers to be compared
            _, _, answers = measure_answers(corpus, mode=mode.split(":", 1)[1], queries=int(count), seed=int(seed))
            print(json.dumps([_answer(a) for a in answers]), flush=True)
            continue
        if mode == "conversation":
            rng = random.Random(int(seed))
            cpu, wall = [], []
            for tenant_id, question in (rng.choice(questions) for _ in range(int(count))):
                started = time.process_time()
                wall.append(ask(tenant_id=tenant_id, question=question)[1])
                cpu.append((time.process_time() - started) * 1000)
        else:
            wall, cpu, _ = measure_answers(corpus, mode=mode, queries=int(count), seed=int(seed))
        print(json.dumps({"cpu": statistics.median(cpu), "wall": statistics.median(wall)}), flush=True)


def _answer(response: object) -> list[list[tuple[str, float]]]:
    """A search response's hits, bucket by bucket: ids and scores."""
    return [
        [(hit.id, hit.score) for hit in getattr(response, bucket)]
        for bucket in ("memories", "example_queries", "entities")
    ]


# Scores closer than this are the same answer: two ways of summing the same float32 products differ in the last bits.
SAME_SCORE = 1e-5


def _same(a: list[list[list[Any]]], b: list[list[list[Any]]]) -> bool:
    """Whether two answers (:func:`_answer`, through JSON) hold the same hits in the same order, scores within
    SAME_SCORE."""
    return len(a) == len(b) and all(
        len(x) == len(y) and all(p[0] == q[0] and abs(p[1] - q[1]) <= SAME_SCORE for p, q in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, help="code tree A (builds the stack: its migrations apply)")
    parser.add_argument("--b", required=True, help="code tree B")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--queries", type=int, default=60, help="searches per mode per round")
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--entities", type=int, default=1_000)
    parser.add_argument("--locomo", default=None, help="a LoCoMo-shaped file: also time its questions")
    parser.add_argument("--conversations", type=int, default=3)
    args = parser.parse_args()
    python, script = sys.executable, str(Path(__file__).resolve())
    workdir = Path(tempfile.mkdtemp(prefix="engram-ab-"))
    spec = workdir / "spec.json"
    trees = {"A": args.a, "B": args.b}
    holder = subprocess.Popen(
        [python, script, "_hold", str(spec), str(args.memories), str(args.entities), args.locomo or "",
         str(args.conversations)],
        env={**os.environ, "PYTHONPATH": args.a},
    )  # fmt: skip
    workers: dict[str, subprocess.Popen[str]] = {}
    try:
        while not spec.exists():
            if holder.poll() is not None:
                raise SystemExit("the stack did not come up")
            time.sleep(0.5)
        for name, tree in trees.items():
            workers[name] = subprocess.Popen(
                [python, script, "_work", str(spec), str(workdir / f"home-{name}")],
                env={**os.environ, "PYTHONPATH": tree},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        for worker in workers.values():
            while (line := worker.stdout.readline()) and line.strip() != "ready":  # type: ignore[union-attr]
                pass
        modes = [*MODES, *(["conversation"] if args.locomo else [])]
        figures: dict[tuple[str, str], list[dict]] = {(n, m): [] for n in trees for m in modes}
        for number in range(args.rounds):
            for mode in modes:
                for name in ("A", "B") if number % 2 == 0 else ("B", "A"):
                    worker = workers[name]
                    worker.stdin.write(f"{mode} {args.queries} {number}\n")  # type: ignore[union-attr]
                    worker.stdin.flush()  # type: ignore[union-attr]
                    figures[name, mode].append(json.loads(worker.stdout.readline()))  # type: ignore[union-attr]
        for mode in MODES:  # the same searches must answer the same in both trees
            got = {}
            for name, worker in workers.items():
                worker.stdin.write(f"answers:{mode} {args.queries} 99\n")  # type: ignore[union-attr]
                worker.stdin.flush()  # type: ignore[union-attr]
                got[name] = json.loads(worker.stdout.readline())  # type: ignore[union-attr]
            differ = sum(not _same(a, b) for a, b in zip(got["A"], got["B"], strict=True))
            print(f"{mode:12s} answers: {differ} of {args.queries} differ between A and B")
        from api.bench import machine_speed_ms

        print(f"python_loop_ms {machine_speed_ms():.1f} (after the rounds)")
        for mode in modes:
            a = [f["cpu"] for f in figures["A", mode]]
            b = [f["cpu"] for f in figures["B", mode]]
            ratio = statistics.median(y / x for x, y in zip(a, b, strict=True))
            print(
                f"{mode:12s} cpu p50 ms  A {statistics.median(a):.2f} (best round {min(a):.2f})  "
                f"B {statistics.median(b):.2f} (best round {min(b):.2f})  B/A {ratio:.2f}  |  wall p50 ms  "
                f"A {statistics.median(f['wall'] for f in figures['A', mode]):.2f}  "
                f"B {statistics.median(f['wall'] for f in figures['B', mode]):.2f}"
            )
    finally:
        for worker in workers.values():
            if worker.stdin:
                worker.stdin.close()
            worker.wait(timeout=60)
        spec.with_suffix(".stop").touch()
        holder.wait(timeout=120)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_hold":
        hold(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] or None, int(sys.argv[6]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_work":
        work(Path(sys.argv[2]), sys.argv[3])
    else:
        main()
