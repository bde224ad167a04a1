"""Data-only package: the bundled local embedding model (see README.md here)."""
