"""What gets embedded: one doc (a memory or a catalog entity) with the text its one renderer produced."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Doc:
    canonical_id: str
    doc_kind: str
    text: str
