"""Write the server's OpenAPI document (what /openapi.json serves) to a file, for client generation:

    python scripts/export_openapi.py clients/typescript/openapi.json
    (cd clients/typescript && npm run generate)
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path


def export(path: Path) -> None:
    from api.app import create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FastAPI's notes on duplicate operation ids of HEAD routes
        spec = create_app().openapi()
    path.write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    export(Path(sys.argv[1] if len(sys.argv) > 1 else "clients/typescript/openapi.json"))
