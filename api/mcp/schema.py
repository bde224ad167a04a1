"""Lean tool input schemas: what pydantic generates, without what costs tokens and tells a model nothing.

Tool definitions are sent to the model on every turn. pydantic adds a ``title`` to every property (the
name again) and spells an optional argument as ``anyOf: [T, null]`` with ``default: null``; an argument
left out of ``required`` already says it is optional. Validation is unaffected: FastMCP validates the
arguments with the tool function's own pydantic model, not with this schema.
"""

from __future__ import annotations

from typing import Any

_NULL = {"type": "null"}


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without titles and without the null branch of optional arguments."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: compact_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = compact_schema(value)
        elif key == "anyOf" and isinstance(value, list):
            out[key] = [compact_schema(sub) for sub in value]
        else:
            out[key] = value
    branches = out.get("anyOf")
    if isinstance(branches, list) and _NULL in branches and out.get("default", 0) is None:
        rest = [branch for branch in branches if branch != _NULL]
        del out["anyOf"], out["default"]
        out = {**rest[0], **out} if len(rest) == 1 else {"anyOf": rest, **out}
    return out
