"""Driving Debian's Chromium in the browser tests (never a browser download at test time)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.api import OPERATOR_KEY

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def signed_in_context(browser, api_server: str, *, width: int, height: int = 1000):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.goto(f"{api_server}/dashboard")
    page.fill("input[name=key]", OPERATOR_KEY)
    page.click("button[type=submit]")
    return context, page


def no_horizontal_overflow(page) -> bool:  # type: ignore[no-untyped-def]
    return bool(
        page.evaluate(
            "() => document.documentElement.scrollWidth <= document.documentElement.clientWidth"
            " && document.body.scrollWidth <= document.documentElement.clientWidth"
        )
    )
