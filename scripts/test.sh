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
exec .venv/bin/python -m pytest "$@"
