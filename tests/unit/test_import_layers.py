"""The layers contract in pyproject.toml covers every module of core.

core.memories and core.tenancy are split across two layers module by module, so a module added to either
package would otherwise escape the contract silently: this test names it instead.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
# Packages whose own __init__ holds no code: their modules are placed one by one.
SPLIT_PACKAGES = {"core", "core.memories", "core.tenancy"}


def _layered_modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [contract["layers"] for contract in config["contracts"] if contract["type"] == "layers"]
    return [name.strip() for layer in layers for name in layer.replace("|", ":").split(":")]


def test_every_core_module_sits_in_a_layer() -> None:
    layered = _layered_modules()
    graph = grimp.build_graph("core")
    outside = sorted(
        module
        for module in graph.modules
        if module not in SPLIT_PACKAGES and not any(module == name or module.startswith(name + ".") for name in layered)
    )
    assert outside == [], f"add these modules to a layer in pyproject.toml [tool.importlinter]: {outside}"


def test_split_packages_hold_no_code_of_their_own() -> None:
    for package in SPLIT_PACKAGES - {"core"}:
        init = ROOT / package.replace(".", "/") / "__init__.py"
        body = [line for line in init.read_text().splitlines() if line.strip() and not line.startswith(("#", '"""'))]
        assert all(not line.startswith(("import ", "from ")) for line in body), f"{init} imports modules"
