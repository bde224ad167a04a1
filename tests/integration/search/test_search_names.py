"""Names (core.search.names): a question that names someone is about them; the fused top hits are re-scored by
the share of the question's names their own text says."""

from __future__ import annotations

import pytest

from core.search.names import NAME_SHARE, question_names, with_names
from tests.helpers.api import ids, save, search


@pytest.mark.parametrize(
    ("rule", "question", "names"),
    [
        ("a capitalised word inside the question is a name", "What did Caroline research?", ["caroline"]),
        ("a possessive names its owner", "What is Melanie's favourite book?", ["melanie"]),
        ("the question's first word is no name", "Caroline went where?", []),
        ("a word opening a later sentence is no name either", "Where did she go? Tell me.", []),
        ("function words are no names, capitalised or not", "What did I say to Bob?", ["bob"]),
        ("each name once, in order", "Did Ann meet Bob, or did Bob meet Ann?", ["ann", "bob"]),
        ("a question in lower case has no names", "what did caroline research?", []),
    ],
)
def test_question_names(rule, question, names) -> None:
    """A name is a capitalised word of the question that does not open it or a sentence in it and is not a
    function word; names are lowercased, each once."""
    assert question_names(question) == names, rule


TEXTS = {
    "caroline": "Caroline: I researched adoption agencies",
    "melanie": "Melanie: I went to a pottery class with Caroline",
    "both": "Melanie: Caroline, that is great news",
    "neither": "Thanks, that is great news",
}


@pytest.mark.parametrize(
    ("rule", "ranking", "names", "expected"),
    [
        (
            "a hit that names none of the names keeps 1 - NAME_SHARE of its relevance",
            [("neither", 0.8), ("caroline", 0.5)],
            ["caroline"],
            [("caroline", 0.5), ("neither", pytest.approx(0.8 * (1 - NAME_SHARE)))],
        ),
        (
            "in between, in proportion to the share of names said",
            [("caroline", 0.6), ("both", 0.6)],
            ["caroline", "melanie"],
            [("both", 0.6), ("caroline", pytest.approx(0.6 * (1 - NAME_SHARE / 2)))],
        ),
        (
            "names match whole words, whatever their case",
            [("melanie", 0.6), ("caroline", 0.5)],
            ["pottery"],
            [("melanie", 0.6), ("caroline", pytest.approx(0.5 * (1 - NAME_SHARE)))],
        ),
        (
            "equal scores keep the fused order",
            [("melanie", 0.6), ("caroline", 0.6)],
            ["caroline"],
            [("melanie", 0.6), ("caroline", 0.6)],
        ),
        ("a question without names changes nothing", [("neither", 0.8), ("both", 0.5)], [], None),
        ("a hit whose text is not at hand is left as it is", [("unknown", 0.8), ("both", 0.5)], ["caroline"], None),
    ],
)
def test_with_names(rule, ranking, names, expected) -> None:
    """Each hit's relevance times (1 - NAME_SHARE) + NAME_SHARE * (names its text says / names); re-sorted."""
    got = with_names(ranking, names=names, text_of=TEXTS.get)
    assert got == (ranking if expected is None else expected), rule


def test_a_question_naming_a_speaker_prefers_their_turns(client, tenant):
    """Every turn of a run borrows its neighbours' words, names included: the question naming one speaker
    ranks that speaker's turn first, above the other speaker's turn that says the topic word three times
    (without the names step that one is first)."""
    run = {"run_id": "chat-9", "category": "workspace"}
    turns = [
        "Caroline: Pottery is my favourite, I love pottery bowls and pottery classes.",
        "Melanie: I made a small bowl at the class last week.",
        "Caroline: That sounds lovely.",
    ]
    made = [save(client, tenant, {"content": turn, "sync_embed": True, **run}) for turn in turns]
    found = ids(search(client, tenant, {"question": "What pottery did Melanie make?"})["memories"])
    assert found[0] == made[1]
