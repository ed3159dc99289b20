"""A bucket of the delta sync's patches (rlhf_cli/rank/engines/weights.Patch) as one safetensors file in the run's
weight directory, the transport a vLLM server reads them over (rlhf_cli/rank/engines/vllm/server.py writes,
worker_extension.py reads): each patch's values and flat indices as tensors, its checkpoint name and shape in the
file's metadata. safetensors, not pickle: the server loads nothing it would execute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NAMES_KEY = "rlhf_patches"  # the metadata entry: [[checkpoint name, shape], ...] in the order of the tensors


def write_patch_file(path: Path, patches: list[Any]) -> Path:
    """`patches` (Patch) into `path`, replacing what it held; indices of a whole-tensor patch are written too."""
    import torch
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Any] = {}
    for number, patch in enumerate(patches):
        indices = patch.indices if patch.indices is not None else torch.arange(patch.values.numel())
        tensors[f"{number}.values"] = patch.values.detach().to("cpu").contiguous()
        tensors[f"{number}.indices"] = indices.to("cpu", torch.int64).contiguous()
    save_file(tensors, str(path), metadata={NAMES_KEY: json.dumps([[p.name, list(p.shape)] for p in patches])})
    return path


def read_patch_file(path: str | Path) -> list[tuple[str, tuple[int, ...], Any, Any]]:
    """(checkpoint name, shape, values, flat indices) of each patch in the file, in the order written."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as saved:
        named = json.loads(saved.metadata()[NAMES_KEY])
        return [(name, tuple(shape), saved.get_tensor(f"{number}.values"), saved.get_tensor(f"{number}.indices"))
                for number, (name, shape) in enumerate(named)]
