"""The import graph: no cycles, and each layer imports only the layers below it (imports inside functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "rlhf_cli"
# Data flows one way: flags + recipe -> resolved run -> plan -> launch -> ranks -> trainer. A layer may import
# the leaves and the layers listed for it, never one above it.
# `generation` is one: how a run generates and syncs (the choice and the gather budget's units), read by the config
# layer, the plan, the launcher and the ranks.
# `output` (the output dir's contract: its names, small files, checkpoints, ownership and lock) is read and written by
# the config layer, the launcher, the launch supervisor and the ranks. `models` (config.json without weights, and the
# modules LoRA adapts) is read by resolution's checks, the plan and the ranks. `machine.probe` (GPUs, CUDA, memory,
# free disk, no torch) is asked by resolution, the plan, the launcher and `rlhf doctor`.
# `phases` (the step's phases: what the plan predicts, the ranks measure and the output shows) is named by all.
LEAVES = {"rlhf_cli", "rlhf_cli.errors", "rlhf_cli.sizes", "rlhf_cli.phases", "rlhf_cli.generation",
          "rlhf_cli.generation.budget",
          "rlhf_cli.generation.choice", "rlhf_cli.generation.engines", "rlhf_cli.generation.sync_buckets",
          "rlhf_cli.generation.sync_check",
          "rlhf_cli.machine.probe", "rlhf_cli.machine.cache", "rlhf_cli.machine.gpus", "rlhf_cli.machine.calibration",
          "rlhf_cli.machine.corrections",
          "rlhf_cli.output", "rlhf_cli.output.run_dir", "rlhf_cli.output.files", "rlhf_cli.output.checkpoints",
          "rlhf_cli.output.ownership", "rlhf_cli.output.lock", "rlhf_cli.models", "rlhf_cli.models.hub",
          "rlhf_cli.models.architectures", "rlhf_cli.models.dtype"}
# The top: the CLI and `python -m rlhf_cli` may import any layer.
TOP = {"cli", "__main__"}
MAY_IMPORT = {
    "algorithms": {"algorithms"},
    "config": {"algorithms", "config"},
    "plan": {"algorithms", "config", "plan"},
    "launch": {"algorithms", "config", "launch", "compat"},
    "rank": {"algorithms", "config", "rank", "compat"},
    "compat": set(),
    "report": {"report"},
    "schema": {"algorithms", "schema"},
    "machine": {"plan"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every rlhf_cli module `path` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
    return {name for name in found if name.startswith("rlhf_cli")}


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: {imported for imported in _imports(path) if imported in modules and imported != name}
            for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and module not in LEAVES else None


def test_no_import_cycles() -> None:
    assert _cycles(import_graph()) == []


def test_layers_import_only_downwards() -> None:
    wrong = []
    for module, imported in import_graph().items():
        layer = _layer(module)
        if layer not in MAY_IMPORT:
            continue
        for target in imported:
            target_layer = _layer(target)
            if target_layer is not None and target_layer != layer and target_layer not in MAY_IMPORT[layer]:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_every_module_is_a_leaf_or_in_a_layer() -> None:
    assert [module for module in import_graph() if _layer(module) not in {None, *MAY_IMPORT, *TOP}] == []


def test_leaves_import_only_leaves() -> None:
    wrong = [f"{module} imports {target}" for module, imported in import_graph().items() if module in LEAVES
             for target in imported if target not in LEAVES]
    assert wrong == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
