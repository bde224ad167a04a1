"""`engram bench ...` end to end on their own throwaway embedded stacks: the figures they name come out."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.benchmark


def _own_stack_env(tmp_path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The environment of a command that starts its own throwaway stack: none of the suite's ENGRAM_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env["ENGRAM_HOME"] = str(tmp_path / "home")
    return env


def _bench(tmp_path, *args: str) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    """The figures of `engram bench ... --json` run on its own throwaway stack (no ENGRAM_* of the suite's)."""
    done = subprocess.run(
        [sys.executable, "-m", "api.cli", "bench", *args, "--json"],
        env=_own_stack_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_bench_write_prints_latency_and_throughput_figures(tmp_path):
    figures = _bench(tmp_path, "write", "--sizes", "50", "--saves", "20", "--batches", "1")
    by_metric = {f["metric"]: f for f in figures}
    assert set(by_metric) == {"save_p50_ms", "save_p95_ms", "save_p50_ms_httpx", "batch_per_s"}
    assert all(f["bench"] == "write" and f["value"] > 0 for f in figures)
    assert by_metric["save_p50_ms"]["params"] == {"memories": 50} and by_metric["save_p50_ms"]["unit"] == "ms"
    assert by_metric["batch_per_s"]["unit"] == "memories/s"


def test_bench_search_prints_every_mode_and_the_machine_speed(tmp_path):
    figures = _bench(tmp_path, "search", "--memories", "300", "--entities", "60", "--queries", "5")
    assert figures[0]["metric"] == "python_loop_ms" and figures[0]["value"] > 0
    modes = {f["params"]["mode"] for f in figures[1:]}
    assert modes == {"hybrid", "entities", "question", "recent", "important", "typed"}
    for mode in modes:
        metrics = {f["metric"]: f["value"] for f in figures[1:] if f["params"]["mode"] == mode}
        assert set(metrics) == {"p50_ms", "p95_ms", "cpu_p50_ms", "cpu_p95_ms", "hits_mean", "degraded_share"}
        assert 0 < metrics["p50_ms"] <= metrics["p95_ms"]
        # The timed calls answered: every mode finds memories on this corpus, with every channel up.
        assert metrics["hits_mean"] > 0 and metrics["degraded_share"] == 0


def test_bench_embed_runs_the_pipeline_on_the_model_asked_for(tmp_path):
    """Saves through a real API process, embedded by a real worker until coverage is complete."""
    figures = _bench(tmp_path, "embed", "--memories", "300", "--model", "local/hashing-256")
    by_metric = {f["metric"]: f for f in figures}
    assert set(by_metric) == {"raw_per_s", "pipeline_per_s", "pipeline_ratio"}
    assert all(f["params"]["model"] == "local/hashing-256" for f in figures)
    raw, pipeline = by_metric["raw_per_s"]["value"], by_metric["pipeline_per_s"]["value"]
    assert raw > 0 and pipeline > 0
    assert abs(by_metric["pipeline_ratio"]["value"] - pipeline / raw) < 1e-3  # figures are printed rounded


def test_bench_tenants_reports_warm_and_cold_latency_rss_and_open_files(tmp_path):
    """Many tenants behind one real API process: every mode's percentiles, the cold first searches, the
    process's RSS and descriptors, and every search answered 200."""
    figures = _bench(tmp_path, "tenants", "--tenants", "12", "--searches", "80", "--large-size", "500")
    by_metric: dict[str, list[dict]] = {}  # type: ignore[type-arg]
    for f in figures:
        by_metric.setdefault(f["metric"], []).append(f)
    assert {"p50_ms", "p95_ms", "p99_ms", "cold_p95_ms", "rss_mb", "open_files"} <= set(by_metric)
    assert {f["params"]["mode"] for f in by_metric["p95_ms"]} == {"hybrid", "question", "entities", "recent"}
    assert all(f["params"]["tenants"] == 12 for f in figures)
    assert by_metric["non_2xx"][0]["value"] == 0 and by_metric["searches"][0]["value"] == 80
    # Every tenant touched is cold once: the cold count is the number of distinct tenants searched.
    assert 1 <= by_metric["tenants_touched"][0]["value"] <= 12
    # A tenant's first search with a question after one without is counted apart, once per tenant at most.
    assert 0 <= by_metric["first_questions"][0]["value"] <= by_metric["tenants_touched"][0]["value"]
    assert by_metric["rss_mb"][0]["value"] > 10 and by_metric["open_files"][0]["value"] > 0


def test_search_steps_times_each_step_and_idles_between_searches_when_asked(tmp_path):
    """`scripts/search_steps.py` (docs/benchmarks.md, Search and Processes): a line per step, the run's CPU p50, and
    with --pause-ms the idle before each search, outside the timed calls."""
    searches, pause_ms = 8, 250
    done = subprocess.run(
        [sys.executable, "scripts/search_steps.py", "--memories", "300", "--entities", "60"]
        + ["--searches", str(searches), "--pause-ms", str(pause_ms)],
        env=_own_stack_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    summary = next(line for line in lines if line.startswith("hybrid:"))
    assert f"{searches} searches, {pause_ms} ms idle before each, CPU p50" in summary
    cpu_p50 = float(summary.split("CPU p50 ")[1].split(" ms")[0])
    assert 0 < cpu_p50 < pause_ms  # (the idle is not in the timed CPU)
    assert float(summary.split(" in ")[1].split(" s")[0]) >= searches * pause_ms / 1000  # (but in the wall time)
    spent = {line[:55].strip(): float(line[55:].split()[0]) for line in lines if line.endswith("µs a search")}
    assert spent["run_search"] > 0 and spent["full-text: searches"] > 0 and spent["dense: exact rankings"] > 0
    assert spent["run_search"] >= spent["fuse"] > 0
