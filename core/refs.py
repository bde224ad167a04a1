"""``memory:<id>``: how a memory is named as an entity, a search doc and an embedding's canonical id.

The one definition of the prefix; every layer (catalog, memories, search, embeddings, lifecycle) imports
it from here, below all of them.
"""

from __future__ import annotations

MEMORY_PREFIX = "memory:"


def memory_ref(memory_id: str) -> str:
    """The canonical entity (and doc id) naming memory ``memory_id``."""
    return MEMORY_PREFIX + memory_id


def is_memory_ref(s: str) -> bool:
    """True for ``memory:<id>`` strings (whether or not the id is well-formed)."""
    return s.startswith(MEMORY_PREFIX)


def memory_id_of(ref: str) -> str:
    """The id inside a ``memory:<id>`` ref; ValueError for anything else."""
    if not is_memory_ref(ref):
        raise ValueError(f"{ref!r} is not a memory reference")
    return ref[len(MEMORY_PREFIX) :]
