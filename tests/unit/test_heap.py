"""The API process settles its heap once it has loaded (core.heap): its start-up objects frozen out of the
collector's sight, its young generation collected after YOUNG_THRESHOLD allocations, not CPython's 700."""

from __future__ import annotations

import json
import subprocess
import sys

from core.heap import YOUNG_THRESHOLD


def test_the_api_process_freezes_its_start_up_heap_and_collects_the_young_less_often():
    probe = (
        "import gc, json; before = gc.get_threshold(); import api.main; "
        "print(json.dumps({'before': before, 'after': gc.get_threshold(), 'frozen': gc.get_freeze_count()}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"][0] == 700  # CPython's default, until the app is loaded
    assert seen["after"] == [YOUNG_THRESHOLD, seen["before"][1], seen["before"][2]]
    assert seen["frozen"] > 50_000  # the loaded modules, the app and its routes
