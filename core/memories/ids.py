"""Memory id rules: the supplied-id charset and what counts as integer-shaped."""

from __future__ import annotations

import re

from core.errors import Invalid

MAX_ID_LENGTH = 200
# Excluded: the separators of canonical refs and URLs (: / ? #), whitespace, and control characters.
_FORBIDDEN = re.compile(r"[:/?#\s\x00-\x1f\x7f-\x9f]")
_INTEGER_SHAPED = re.compile(r"(0|[1-9][0-9]*)")


def validate_memory_id(memory_id: str, *, field: str = "id") -> str:
    if not isinstance(memory_id, str) or memory_id == "":
        raise Invalid("id must be a non-empty string", field=field)
    if len(memory_id) > MAX_ID_LENGTH:
        raise Invalid(f"id is longer than {MAX_ID_LENGTH} characters", field=field)
    bad = _FORBIDDEN.search(memory_id)
    if bad:
        raise Invalid(
            f"id contains a forbidden character {bad.group()!r} (':', '/', '?', '#', whitespace and "
            "control characters are not allowed)",
            field=field,
        )
    return memory_id


def integer_value(memory_id: str) -> int | None:
    """The id's integer value if it is integer-shaped (digits, no leading zero), else None."""
    if _INTEGER_SHAPED.fullmatch(memory_id):
        return int(memory_id)
    return None
