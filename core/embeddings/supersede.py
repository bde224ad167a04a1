"""When a near-duplicate may supersede an older memory: the evidence a cosine score alone cannot give.

Superseding claims that the newer memory replaces the older one. A high cosine does not show that: with
the bundled static model, distinct templated facts score above 0.95 (``Customer 1042 is on the pro plan``
vs ``Customer 1043 ...``: 0.968; ``outbox-57 holds 57 rows`` vs ``outbox-59 holds 59 rows``: 0.971), as do
two values of one setting (``refund window is 30 days`` vs ``45 days``: 0.923). So, besides the cosine
threshold, a supersede needs

* the same linked entities (what the memories are about), and
* near-identical text: the same words in the same order once case and punctuation are set aside, up to
  a few words added or removed; a word *replaced* (another id, another number, another name) makes a
  different fact, which is reported as ``similar_existing`` for the caller to decide instead.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

_WORD = re.compile(r"\w+")
# Words one version may add or drop (the longer text's share, and at least this many): a rewording, not a new fact.
MAX_EDIT_SHARE = 0.2
MIN_EDIT_ALLOWANCE = 2


def words(text: str) -> list[str]:
    """The text's words, lower-cased; punctuation and spacing are not evidence of a different fact."""
    return _WORD.findall(text.casefold())


def near_identical(older: str, newer: str) -> bool:
    """True when one text is the other with at most a few words inserted or deleted, and none replaced."""
    a, b = words(older), words(newer)
    if a == b:
        return True
    edits = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "replace":
            return False
        if op != "equal":
            edits += (i2 - i1) + (j2 - j1)
    return edits <= max(MIN_EDIT_ALLOWANCE, int(MAX_EDIT_SHARE * max(len(a), len(b))))


def may_supersede(
    *, older_text: str, newer_text: str, older_entities: Sequence[str], newer_entities: Sequence[str]
) -> bool:
    """The evidence a cosine above the update threshold needs before one memory supersedes the other."""
    return set(older_entities) == set(newer_entities) and near_identical(older_text, newer_text)
