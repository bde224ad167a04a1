"""`engram eval retrieval`: the LoCoMo-shaped loader and recall computation on the real stack."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from api.bench.retrieval import evaluate, parse_session_date


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)),
        ("10:04 am on 19 January, 2024", datetime(2024, 1, 19, 10, 4, tzinfo=UTC)),
        ("not a date", None),
        (None, None),
    ],
)
def test_parse_session_date(raw, expected):
    assert parse_session_date(raw) == expected


@pytest.mark.parametrize("id_format", ["t1-{}", "D1:{}"])
def test_evaluate_reports_recall_per_category(stack, id_format):
    """Each conversation is its own tenant; recall@k is the share of gold ids in the top k. Turn ids are kept,
    or mapped and back when the memory API would refuse them (LoCoMo's own `D1:3`)."""
    turns = [
        ("s1", "Ana: I adopted a grey kitten named Pixel last week."),
        ("s1", "Ben: That's lovely! How is she settling in?"),
        ("s1", "Ana: Great, she sleeps on my keyboard."),
        ("s2", "Ben: I finally ran the Berlin marathon in under four hours."),
        ("s2", "Ana: Congratulations on the marathon!"),
    ]
    conversation = {
        "conversation": "t1",
        "memories": [
            {
                "id": id_format.format(i),
                "session": s,
                "session_date": "1:56 pm on 8 May, 2023",
                "speaker": c.split(":")[0],
                "content": c,
            }
            for i, (s, c) in enumerate(turns)
        ],
        "questions": [
            {"question": "What is the name of Ana's kitten?", "gold": [id_format.format(0)], "category": "single-hop"},
            {"question": "Which marathon did Ben run?", "gold": [id_format.format(3)], "category": "single-hop"},
            {"question": "Where does the kitten sleep?", "gold": [id_format.format(2)], "category": "multi-hop"},
        ],
    }
    figures = evaluate(conversations=[conversation], log=lambda _: None)
    by_key = {(f["metric"], f["params"].get("category")): f["value"] for f in figures}
    assert by_key[("recall_at_5", "all")] == 1.0
    assert by_key[("recall_at_20", "multi-hop")] == 1.0
    assert ("search_p50_ms", None) in by_key
    assert all(f["bench"] == "eval" for f in figures)


def test_turn_ids_the_api_refuses_are_mapped_without_collisions():
    from api.bench.retrieval import memory_ids

    turns = [{"id": "D1:1"}, {"id": "t0-0"}, {"id": "ok-2"}, {"id": "D1:3"}]
    mapping = memory_ids(turns)
    assert mapping["ok-2"] == "ok-2" and mapping["t0-0"] == "t0-0"
    assert len(set(mapping.values())) == 4 and not any(":" in v for v in mapping.values())


def test_turns_the_api_would_refuse_are_saved_clipped_and_the_evaluation_goes_on(stack):
    long_turn = "Ana: my grandmother's sourdough starter is named Clint. " + "blah " * 12_000
    conversation = {
        "conversation": "t2",
        "memories": [
            {"id": "a", "session": "s1", "speaker": "Ana", "content": long_turn},
            {"id": "b", "session": "s1", "speaker": "Ben" * 4000, "content": "Ben: I repair old bicycles."},
            {"id": "c", "session": "s1", "speaker": "Ana", "content": "   "},
        ],
        "questions": [
            {"question": "What is the sourdough starter called?", "gold": ["a"], "category": "single-hop"},
            {"question": "What does Ben repair?", "gold": ["b"], "category": "single-hop"},
            {"question": "", "gold": ["c"], "category": "odd"},
            {"question": "bicycles " * 5_000, "gold": ["b"], "category": "odd"},
        ],
    }
    assert len(long_turn.encode()) > 50_000
    figures = evaluate(conversations=[conversation], log=lambda _: None)
    by_key = {(f["metric"], f["params"].get("category")): f["value"] for f in figures}
    assert by_key[("recall_at_5", "single-hop")] == 1.0
    assert ("recall_at_20", "odd") in by_key
