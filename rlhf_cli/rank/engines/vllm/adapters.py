"""A colocated vLLM that serves the policy's LoRA itself (rlhf_cli/config/engines/vllm_lora.py decides it): built
with vLLM's LoRA, it holds the base, and each sync's adapters (rlhf_cli/rank/engines/adapters.py) become a new LoRA
of it, a new id each sync, loaded at once from a PEFT-format adapter under the run's directory (vLLM 0.30 loads a
LoRA from files only). Every generation from it passes the current LoRA: TRL's trainers, PPO's rollouts and the
sync's self-check all call the engine's own `generate` (or `chat`), which this wraps.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path
from typing import Any

from rlhf_cli.compat import vllm_lora
from rlhf_cli.compat.vllm import vllm_model_runner
from rlhf_cli.config.engines.vllm_lora import LoraServing
from rlhf_cli.rank.engines.delta import bit_sums

LORA_DIR = "vllm-lora"  # under the run's output directory: each rank's current adapter
RANK_FOLDER = "rank-"  # under LORA_DIR, then the rank: a colocated vLLM's adapters
GENERATING_METHODS = ("generate", "chat")


def engine_arguments(lora: LoraServing | None) -> dict[str, Any]:
    """What TRL's `LLM(...)` is built with for the run's LoRA: vLLM's LoRA, one adapter at a time, of the run's
    rank, when it serves the adapters; nothing else."""
    if lora is None or not lora.served:
        return {}
    return {"enable_lora": True, "max_lora_rank": lora.max_rank, "max_loras": 1}


def write_adapter(path: Path, packed: Any) -> Path:
    """`packed` (adapters.PackedAdapters) as PEFT saves an adapter, in the directory `path`, which vLLM loads."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(packed.tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(packed.config))
    return path


class ServedLora:
    """The LoRA a colocated `vllm.LLM` serves the policy's adapters as (rlhf_cli/rank/engines/weights.AdapterServer)."""

    def __init__(self, llm: Any, directory: Path, max_rank: int) -> None:
        self.llm = llm
        self.directory = directory
        self.max_rank = max_rank
        self.request: Any | None = None  # the vllm LoRARequest every generation passes; None before the first

    def load(self, packed: Any) -> None:
        """Serve `packed` (adapters.PackedAdapters) as a new LoRA in place of the last one."""
        from vllm.lora.request import LoRARequest

        previous = self.request
        number = previous.lora_int_id + 1 if previous else 1
        path = write_adapter(self.directory / f"sync-{number}", packed)
        request = LoRARequest(f"policy-{number}", number, str(path))
        vllm_lora.vllm_swap_lora(self.llm, previous.lora_int_id if previous else None, request)
        self.request = request
        if previous:
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def checksums(self) -> dict[str, tuple[int, int]] | None:
        if vllm_lora.vllm_tensor_parallel_size(self.llm) > 1:
            return None  # each rank serves a slice of each matrix: no rank holds what was sent
        if self.request is None:
            return {}
        return {name: bit_sums(matrices) for name, matrices in
                vllm_lora.vllm_served_lora(vllm_model_runner(self.llm), self.request.lora_int_id).items()}


def serve_lora(llm: Any, lora: LoraServing | None, output_dir: str) -> None:
    """Make `llm` (just built with `engine_arguments(lora)`) serve the policy's adapters when `lora` says it can:
    its `generate` and `chat` pass the current LoRA; `llm.rlhf_lora_reason` says why not otherwise."""
    llm.rlhf_lora_reason = lora.reason if lora is not None else None
    if lora is None or not lora.served:
        return
    rank = os.environ.get("RANK", "0")
    served = llm.rlhf_lora = ServedLora(llm, Path(output_dir, LORA_DIR, RANK_FOLDER + rank), lora.max_rank)
    for name in GENERATING_METHODS:
        setattr(llm, name, _with_lora(getattr(llm, name), served))


def _with_lora(method: Any, served: ServedLora) -> Any:
    @functools.wraps(method)
    def generating(*args: Any, **kwargs: Any) -> Any:
        if served.request is not None:
            kwargs.setdefault("lora_request", served.request)
        return method(*args, **kwargs)

    return generating
