#!/usr/bin/env bash
# Installs engram with its test tools into ./.venv and runs the checks: ruff, mypy, the import layers
# (lint-imports, contracts in pyproject.toml), then the test suite on the real stack (embedded PostgreSQL +
# pgvector and Redis started by the suite itself).
set -euo pipefail
cd "$(dirname "$0")/.."

# The dashboard's browser test drives Debian's Chromium (no browser download at test time).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# The Python SDK (clients/python, engram_client) is installed with the server, which is built on it.
.venv/bin/python -m pip install --quiet -e '.[test]'
# The TypeScript client's pinned toolchain (openapi-typescript, openapi-fetch, tsc) from its lock file.
if command -v npm >/dev/null; then
  (cd clients/typescript && npm ci --no-audit --no-fund --silent)
fi

.venv/bin/ruff check core api workers tests scripts clients/python
.venv/bin/mypy core api workers
.venv/bin/lint-imports
# Two processes, each taking whole test files and starting its own stack: most of the suite's time is spent
# waiting on the processes it starts and kills (serve, workers, replicas), so two take ~12 minutes where one
# took ~17 (docs/benchmarks.md, Test suite). ENGRAM_TEST_PROCESSES=0 runs it in this process; "$@" may say -n too.
exec .venv/bin/python -m pytest -n "${ENGRAM_TEST_PROCESSES:-2}" --dist loadfile "$@"
