"""The README's quickstart, run as written: every `$` line of its console blocks, in order, in a shell, against
a real `engram serve` on a fresh home, and each printed answer compared with what the README shows.

The comparison lets through what differs on every run (keys, timestamps, job ids, the home and port, the
temporary directory) and what the README elides with "..."; everything else must match.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from api.serve.embedded import free_port
from tests.helpers.processes import make_temp_dir

REPO = Path(__file__).resolve().parents[3]
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)")
_WILD = "\x00"  # stands for "anything" while the expected text is turned into a pattern


@dataclass
class Step:
    command: str
    expected: str


def quickstart_steps() -> list[Step]:
    """The `$` commands of the README's quickstart console blocks with the output shown under each."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## One-minute quickstart") : text.index("### Operators")]
    steps: list[Step] = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                i += 1
                continue
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            i += 1
            output = []
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                i += 1
            steps.append(Step(command=command, expected="\n".join(output).strip()))
    return steps


def matches(expected: str, actual: str, *, substitutions: dict[str, str]) -> bool:
    """Whether ``actual`` is what the README shows, up to run-specific values and "..." elisions."""
    # A JSON answer wrapped over lines in the README is one line in reality.
    if expected.startswith("{"):
        expected = expected.replace("\n ", "")
    for shown, real in substitutions.items():
        expected = expected.replace(shown, real)
    expected = _TIMESTAMP.sub(_WILD, expected)
    expected = re.sub(r"\begk_[\w-]+|\begop_[\w-]+|\bkey_[0-9a-f]{16}\b", _WILD, expected)
    expected = expected.replace("...", _WILD)
    pattern = re.escape(expected).replace(re.escape(_WILD), ".*")
    return re.fullmatch(pattern, actual.strip(), flags=re.S) is not None


@pytest.fixture(scope="module")
def served() -> Iterator[dict]:
    base = make_temp_dir("engram-readme-")
    port = free_port()
    bin_dir = base / "bin"
    bin_dir.mkdir()
    # `engram` on the PATH, as `source .venv/bin/activate` puts it there, running this checkout.
    (bin_dir / "engram").write_text(f'#!/bin/sh\nexec {sys.executable} -m api.cli "$@"\n')
    (bin_dir / "engram").chmod(0o755)
    (base / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(
        ENGRAM_HOME=str(base / "home"),
        PATH=f"{bin_dir}:{env['PATH']}",
        PYTHONPATH=str(REPO),
        TMPDIR=str(base / "tmp"),
    )
    out = open(base / "serve.out", "w")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "serve", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while "Press Ctrl-C" not in (base / "serve.out").read_text() and process.poll() is None:
            assert time.monotonic() < deadline, (base / "serve.out").read_text()
            time.sleep(0.3)
        output = (base / "serve.out").read_text()
        assert "Press Ctrl-C" in output, output
        yield {"base": base, "port": port, "env": env, "output": output}
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        out.close()
        shutil.rmtree(base, ignore_errors=True)


def test_every_quickstart_line_works_as_shown(served):
    steps = quickstart_steps()
    assert steps and steps[0].command == ".venv/bin/engram serve"
    port = served["port"]
    key = re.search(r"admin key \(shown once\): (\S+)", served["output"]).group(1)  # type: ignore[union-attr]
    substitutions = {
        "localhost:8000": f"localhost:{port}",
        "127.0.0.1:8000": f"127.0.0.1:{port}",
        "/home/me/.engram": str(served["base"] / "home"),
        "/tmp/engram-demo": str(served["base"] / "tmp" / "engram-demo"),
    }
    assert matches(steps[0].expected, served["output"], substitutions=substitutions), served["output"]
    env = dict(served["env"])
    for step in steps[1:]:
        command = step.command
        for shown, real in substitutions.items():
            command = command.replace(shown, real)
        if command == "source .venv/bin/activate":
            continue  # the fixture's PATH already has `engram` first
        if command.startswith("export ENGRAM_API_KEY="):
            env["ENGRAM_API_KEY"] = key
            continue
        result = subprocess.run(
            ["bash", "-c", command], cwd=served["base"], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, f"{step.command}\n{result.stdout}\n{result.stderr}"
        assert matches(step.expected, result.stdout, substitutions=substitutions), (
            f"$ {step.command}\nREADME shows:\n{step.expected}\nbut it printed:\n{result.stdout}"
        )


@pytest.mark.parametrize(
    ("expected", "actual", "ok"),
    [
        ('{"id":"1",...}', '{"id":"1","content":"x"}', True),
        ('{"id":"1",...}', '{"id":"2","content":"x"}', False),
        ('{"a":"2026-11-22T05:05:31.617511+00:00"}', '{"a":"2027-01-01T00:00:00.1+00:00"}', True),
        ("key: egk_abc", "key: egk_other-key_1", True),
        ("memory 2", "memory 3", False),
    ],
)
def test_the_comparison_lets_through_only_what_varies(expected, actual, ok):
    assert matches(expected, actual, substitutions={}) is ok
