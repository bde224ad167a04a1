"""Writes engram_client/_admin_async.py from _admin_sync.py: the same calls, each awaitable.

Run it after changing _admin_sync.py (``python clients/python/scripts/make_async_admin.py``); the engram
repository's tests fail while the two files disagree. A text transform, so the async client's methods keep
their exact signatures and type hints without being written twice by hand.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "engram_client"
HEADER = '''"""The catalog, job, key, operations, tenant, audit and webhook calls of
:class:`engram_client.AsyncEngramClient`.

Written by ``clients/python/scripts/make_async_admin.py`` from :mod:`engram_client._admin_sync`; do not edit.
"""
'''


def async_source(sync_source: str) -> str:
    body = sync_source.split('"""\n', 1)[1]  # drop the sync module's docstring
    body = body.replace("class AdminCalls:", "class AsyncAdminCalls:")
    body = re.sub(r"^    def ", "    async def ", body, flags=re.M)
    body = body.replace("return self._send(", "return await self._send(")
    return HEADER + body


def main() -> int:
    target = PACKAGE / "_admin_async.py"
    wanted = async_source((PACKAGE / "_admin_sync.py").read_text())
    if "--check" in sys.argv:
        return 0 if target.read_text() == wanted else 1
    target.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
