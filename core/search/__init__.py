"""Search building blocks: entity-overlap BM25Plus, full-text (tantivy) and rank fusion."""
