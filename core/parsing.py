"""Parsing untrusted text."""

from __future__ import annotations


def plain_int(text: str, *, max_digits: int) -> int | None:
    """The value of ASCII decimal digits only, at most ``max_digits`` of them; None for anything else.

    ``str.isdigit`` alone is not enough: "²" is a digit to it but int() refuses it, and the length cap keeps
    int() cheap (and under its digit limit) on a client's 5,000-digit value.
    """
    if text.isascii() and text.isdigit() and len(text) <= max_digits:
        return int(text)
    return None
