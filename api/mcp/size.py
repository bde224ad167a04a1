"""How much of an agent's context the MCP tool definitions take: ``python -m api.mcp.size``.

Every tool's name, description, input schema and annotations are sent to the model on every turn, so
their size is a cost paid per turn. Counted with OpenAI's cl100k_base encoding (the one litellm ships
inside its package, so no download); without litellm, with the bundled local model's WordPiece tokenizer.
"""

# Imports inside functions are deferred: tiktoken is optional (litellm's tokenizer files when present, else
# the bundled model's WordPiece through tokenizers), and build_server is loaded only when measuring.
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio


def tool_definitions() -> list[dict[str, Any]]:
    """The tools exactly as `tools/list` answers them."""
    from api.mcp import build_server

    @contextlib.asynccontextmanager
    async def no_client(ctx: Any) -> AsyncIterator[Any]:
        raise RuntimeError("only listing")
        yield  # a generator, as asynccontextmanager needs

    tools = anyio.run(build_server(no_client).list_tools)
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in tools]


# tiktoken's cache file name for cl100k_base (the SHA-1 of its download address), as litellm ships it.
_CL100K_FILE = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"


def _litellm_tokenizers() -> Path | None:
    """litellm's bundled tiktoken cache, found without importing litellm (whose import goes online)."""
    spec = importlib.util.find_spec("litellm")
    for root in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(root) / "litellm_core_utils" / "tokenizers"
        if (folder / _CL100K_FILE).is_file():
            return folder
    return None


def token_counter() -> tuple[str, Callable[[str], int]]:
    """The name of the tokenizer used and a function counting a text's tokens."""
    folder = _litellm_tokenizers()
    if folder is not None and importlib.util.find_spec("tiktoken") is not None:
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(folder))
        import tiktoken

        encoding = tiktoken.get_encoding("cl100k_base")
        return "cl100k_base", lambda text: len(encoding.encode(text, disallowed_special=()))
    from tokenizers import Tokenizer

    import core.embeddings

    wordpiece = Tokenizer.from_file(str(Path(core.embeddings.__file__).parent / "local_model" / "tokenizer.json"))
    return "bundled-wordpiece", lambda text: len(wordpiece.encode(text, add_special_tokens=False).ids)


def measure() -> dict[str, Any]:
    """Tokens per tool and in total, counted over each tool's compact JSON definition."""
    name, count = token_counter()
    per_tool = {tool["name"]: count(json.dumps(tool, separators=(",", ":"))) for tool in tool_definitions()}
    return {"tokenizer": name, "total_tokens": sum(per_tool.values()), "tools": per_tool}


if __name__ == "__main__":
    print(json.dumps(measure(), indent=1))
