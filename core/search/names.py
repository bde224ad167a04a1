"""Names: a question that names someone or something is about it, and a hit should say the name itself.

Full-text cannot tell this apart once memories borrow their neighbours' words (core.search.index): every
turn of a conversation between Caroline and Melanie carries both names, so "What activities does Melanie
partake in?" ranks Caroline's turns next to Melanie's. The re-ranking step here looks at the fused top hits'
own text: a hit that names none of the question's names keeps ``1 - NAME_SHARE`` of its relevance, one that
names them all keeps all of it (in between, in proportion). Ties keep the fused order. A question without
names, or a hit whose text is not at hand, is left as it is.

A name is a word of the question written with a capital letter that does not open the question or a
sentence in it, and is not a function word ("I"); it is matched as a whole word, ignoring case, in the
memory's own rendered text (not the context it borrows).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

from core.search.rankings import QUESTION_STOPWORDS

# The share of a hit's relevance that rests on naming the question's names.
NAME_SHARE = 0.5
_WORD = re.compile(r"[^\W_]+")
# A word that follows the end of a sentence opens that sentence: its capital says nothing.
_SENTENCE_END = re.compile(r"[.!?;:]\s*$")


def question_names(question: str) -> list[str]:
    """The names of a question, lowercased, in order of first appearance."""
    names: list[str] = []
    for match in _WORD.finditer(question):
        word = match.group()
        opens = not question[: match.start()].strip() or _SENTENCE_END.search(question[: match.start()])
        if opens or not word[0].isupper() or word.lower() in QUESTION_STOPWORDS:
            continue
        if word.lower() not in names:
            names.append(word.lower())
    return names


def with_names(
    ranking: Sequence[tuple[str, float]], *, names: Sequence[str], text_of: Callable[[str], str | None]
) -> list[tuple[str, float]]:
    """``ranking`` re-scored by the share of ``names`` each hit's own text says (see the module docstring)."""
    if not names:
        return list(ranking)
    wanted = set(names)
    scored = []
    for order, (doc_id, score) in enumerate(ranking):
        text = text_of(doc_id)
        if text is not None:
            score *= 1.0 - NAME_SHARE + NAME_SHARE * _names_said(text, wanted) / len(wanted)
        scored.append((-score, order, doc_id))
    scored.sort()
    return [(doc_id, -negated) for negated, _, doc_id in scored]


def _names_said(text: str, wanted: set[str]) -> int:
    """How many of ``wanted`` (lowercased names) ``text`` says as whole words, ignoring case.

    An ASCII text is lowercased whole (which moves no word boundary there) and split into words only when
    a name occurs in it at all: most hits name nobody, and splitting every hit's text was most of a
    conversation search's re-ranking."""
    if text.isascii():
        lowered = text.lower()
        present = [name for name in wanted if name in lowered]
        if not present:
            return 0
        words = _ascii_words(lowered)
        return sum(1 for name in present if name in words)
    return len(wanted.intersection(w.lower() for w in _WORD.findall(text)))


@functools.lru_cache(maxsize=4096)
def _ascii_words(lowered: str) -> frozenset[str]:
    """The words of a lowercased ASCII text; a tenant's hits come back search after search, so kept."""
    return frozenset(_WORD.findall(lowered))
