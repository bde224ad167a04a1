"""How many requests one API process runs at once (Settings.api_inflight): the host's requests shared by its
API processes, at least a few each; an explicit ENGRAM_API_MAX_INFLIGHT wins."""

from __future__ import annotations

import pytest

from core.config import API_INFLIGHT_PER_HOST, API_MIN_INFLIGHT, Settings


@pytest.mark.parametrize(("workers", "expected"), [(1, 12), (2, 6), (3, 4), (4, 4), (16, 4)])
def test_the_hosts_requests_are_shared_by_its_processes(workers: int, expected: int) -> None:
    assert (API_INFLIGHT_PER_HOST, API_MIN_INFLIGHT) == (12, 4)
    assert Settings(api_workers=workers).api_inflight == expected


def test_an_explicit_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_API_MAX_INFLIGHT", "9")
    monkeypatch.setenv("ENGRAM_API_WORKERS", "4")
    assert Settings().api_inflight == 9
    monkeypatch.delenv("ENGRAM_API_MAX_INFLIGHT")
    assert Settings().api_inflight == 4
