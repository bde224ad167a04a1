"""The embedder seam: the bundled local model, the query cache, the factory, litellm errors."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading

import numpy as np
import pytest

from core.embeddings import (
    LOCAL_MODEL_NAME,
    Embedder,
    EmbeddingProviderError,
    LiteLLMEmbedder,
    LocalStaticEmbedder,
    get_embedder,
)


@pytest.fixture(scope="module")
def local() -> Embedder:
    return get_embedder("local")


def test_local_model_loads_without_torch_or_network():
    # A fresh interpreter: loading and embedding must not pull torch, transformers or model2vec,
    # and must not touch the network (a hub download would fail here).
    code = (
        "import socket, sys\n"
        "def _no_net(*a, **k): raise RuntimeError('network access attempted')\n"
        "socket.socket.connect = _no_net\n"
        "socket.create_connection = _no_net\n"
        "from core.embeddings import get_embedder\n"
        "e = get_embedder('local')\n"
        "v = e.embed_documents(['offline check'])\n"
        "heavy = [m for m in ('torch', 'transformers', 'model2vec', 'sentence_transformers', 'litellm')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print(e.name, e.dims, v.shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == LOCAL_MODEL_NAME


def test_local_vectors_normalised_with_declared_dims(local):
    assert isinstance(local, LocalStaticEmbedder)
    assert local.name == LOCAL_MODEL_NAME and local.name.startswith("local/")
    texts = ["The cat sat on the mat.", "Revenue grew 12% in Q3.", "", "   ", "😀", "x" * 60_000]
    vecs = local.embed_documents(texts)
    assert vecs.dtype == np.float32
    assert vecs.shape == (len(texts), local.dims)
    assert np.all(np.isfinite(vecs))
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert local.embed_documents([]).shape == (0, local.dims)


def test_local_embeddings_are_deterministic_and_batch_independent(local):
    texts = ["alpha beta", "gamma delta epsilon", "alpha beta"]
    together = local.embed_documents(texts)
    alone = np.stack([local.embed_documents([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-6)
    np.testing.assert_allclose(together[0], together[2], atol=1e-6)


def test_texts_without_known_tokens_are_not_near_duplicates(local):
    a, b, a2 = local.embed_documents(["😀", "🎉🎉", "😀"])
    assert float(a @ a2) > 0.999
    assert abs(float(a @ b)) < 0.5


def test_similar_sentences_score_higher_than_unrelated(local):
    cases = [
        (
            "I adopted a puppy last weekend.",
            "We got a new dog a few days ago.",
            "The quarterly tax filing is due in April.",
        ),
        (
            "Melanie painted a sunrise over the lake.",
            "She made a painting of the sun rising.",
            "The database migration failed on Tuesday.",
        ),
        (
            "Which column stores customer revenue?",
            "revenue per customer is in orders.amount",
            "My favourite band is playing in Berlin tonight.",
        ),
    ]
    for anchor, similar, unrelated in cases:
        a, s, u = local.embed_documents([anchor, similar, unrelated])
        assert float(a @ s) > float(a @ u) + 0.1, (anchor, float(a @ s), float(a @ u))


def test_embed_query_matches_documents_and_is_cached(local):
    local.clear_query_cache()
    hits, misses = local.query_cache_hits, local.query_cache_misses
    q1 = local.embed_query("where did Caroline go on holiday?")
    q2 = local.embed_query("where did Caroline go on holiday?")
    assert q1 is q2
    assert local.query_cache_misses == misses + 1 and local.query_cache_hits == hits + 1
    assert q1.shape == (local.dims,) and q1.dtype == np.float32
    np.testing.assert_allclose(q1, local.embed_documents(["where did Caroline go on holiday?"])[0], atol=1e-6)
    with pytest.raises(ValueError):
        q1[0] = 0.0  # shared cached vectors are read-only


def test_query_cache_is_bounded_lru():
    emb = LocalStaticEmbedder(query_cache_size=2)
    emb.embed_query("one")
    emb.embed_query("two")
    emb.embed_query("one")  # refresh "one": "two" is now the oldest
    emb.embed_query("three")  # evicts "two"
    misses = emb.query_cache_misses
    emb.embed_query("one")
    assert emb.query_cache_misses == misses
    emb.embed_query("two")
    assert emb.query_cache_misses == misses + 1


def test_get_embedder_local_is_a_thread_safe_singleton():
    results: list[Embedder] = []

    def grab() -> None:
        results.append(get_embedder("local"))

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(e) for e in results}) == 1
    assert get_embedder("local") is results[0]
    assert get_embedder(LOCAL_MODEL_NAME) is results[0]


def test_unknown_local_variant_is_rejected():
    with pytest.raises(ValueError, match="local"):
        get_embedder("local/no-such-model")


def test_litellm_names_route_to_litellm_without_importing_it():
    emb = get_embedder("openai/text-embedding-3-small")
    assert isinstance(emb, LiteLLMEmbedder)
    assert emb.name == "openai/text-embedding-3-small" and emb.dims == 1536
    assert get_embedder("openai/text-embedding-3-small") is emb


@pytest.mark.skipif(
    importlib.util.find_spec("litellm") is None,
    reason="litellm not installed (optional extra engram-memory-server[litellm]); provider error mapping not testable",
)
def test_unknown_litellm_provider_raises_provider_error():
    emb = LiteLLMEmbedder("nosuchprovider/some-model")
    with pytest.raises(EmbeddingProviderError) as info:
        emb.embed_documents(["hello"])
    assert "nosuchprovider" in str(info.value)
    assert info.value.retryable is False
    with pytest.raises(EmbeddingProviderError):
        emb.embed_query("hello")


def test_litellm_missing_is_a_provider_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "litellm", None)  # makes `import litellm` raise ImportError
    emb = LiteLLMEmbedder("openai/text-embedding-3-small")
    with pytest.raises(EmbeddingProviderError, match="litellm"):
        emb.embed_documents(["hello"])


def test_worker_keeps_blas_and_tokenizer_single_threaded():
    """A worker's embed jobs run numpy's BLAS and the tokenizer on their own thread (workers.tasks): after
    the worker's start hook, OpenBLAS reports one thread and the tokenizer starts no pool."""
    import os

    code = (
        "import ctypes, os, pathlib, random\n"
        "import numpy as np\n"
        "from workers.tasks import single_threaded_native_pools\n"
        "lib = ctypes.CDLL(str(next((pathlib.Path(np.__file__).parent.parent / 'numpy.libs')"
        ".glob('libscipy_openblas*.so*'))))\n"
        "single_threaded_native_pools()\n"
        "from core.embeddings import get_embedder\n"
        "e = get_embedder('local')\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "rng = random.Random(0)\n"
        "e.embed_documents([' '.join(rng.choice(['a', 'orders', 'paid']) for _ in range(9)) for _ in range(500)])\n"
        "np.ones((300, 300), dtype=np.float32) @ np.ones((300, 300), dtype=np.float32)\n"
        "print(lib.scipy_openblas_get_num_threads64_(), os.environ['TOKENIZERS_PARALLELISM'],"
        " len(os.listdir('/proc/self/task')) - before)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM")}
    env["ENGRAM_REDIS_URL"] = "redis://127.0.0.1:1/0"  # the Celery app is built, never connected
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "false", "0"]
