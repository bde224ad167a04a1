"""`engram eval retrieval`: the LoCoMo-shaped loader and recall computation on the real stack."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.bench.retrieval import evaluate, parse_session_date


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


def test_evaluate_reports_recall_per_category(stack):
    """Each conversation is its own tenant; turns keep their ids; recall@k is the share of gold ids in the top k."""
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
                "id": f"t1-{i}",
                "session": s,
                "session_date": "1:56 pm on 8 May, 2023",
                "speaker": c.split(":")[0],
                "content": c,
            }
            for i, (s, c) in enumerate(turns)
        ],
        "questions": [
            {"question": "What is the name of Ana's kitten?", "gold": ["t1-0"], "category": "single-hop"},
            {"question": "Which marathon did Ben run?", "gold": ["t1-3"], "category": "single-hop"},
            {"question": "Where does the kitten sleep?", "gold": ["t1-2"], "category": "multi-hop"},
        ],
    }
    figures = evaluate(conversations=[conversation], log=lambda _: None)
    by_key = {(f["metric"], f["params"].get("category")): f["value"] for f in figures}
    assert by_key[("recall_at_5", "all")] == 1.0
    assert by_key[("recall_at_20", "multi-hop")] == 1.0
    assert ("search_p50_ms", None) in by_key
    assert all(f["bench"] == "eval" for f in figures)
