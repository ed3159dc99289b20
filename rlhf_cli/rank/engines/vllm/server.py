"""A run's vLLM server seen from the ranks (`vllm_mode: server`): generation through it, and its weight refresh.

Rank 0 holds TRL's `VLLMClient` (the server's OpenAI-compatible `/v1/completions`); every rank's prompts go to it
in one request and each rank gets its share back. Weights reach the server through a directory both can read:
rank 0 writes them as each bucket is gathered (rlhf_cli/rank/engines/vllm/sync.py), then asks the server to reload from
the directory (`POST /collective_rpc` `rlhf_reload_weights`, rlhf_cli/rank/engines/vllm/worker_extension.py, through a
development endpoint: `rlhf vllm-serve` starts the server with VLLM_SERVER_DEV_MODE=1 and that extension) and to
drop its prefix cache. TRL's NCCL weight transfer needs CUDA on both sides: it is the GPU transport; the directory
is the one that works everywhere (and the one tested on CPU).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from rlhf_cli.config.engines.vllm import LOGPROBS_MODE

FLUSH_BYTES = 512 * 2**20  # rank 0 writes a weight file whenever it holds this much: its host memory stays bounded


def server_url(args: Any) -> str:
    return args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"


def write_weight_files(directory: Path, weights: Iterable[tuple[str, torch.Tensor]],
                       flush_bytes: int = FLUSH_BYTES) -> list[Path]:
    """(name, tensor) pairs into safetensors files under `directory` (emptied first), a file whenever the copies
    held reach `flush_bytes`: each tensor is copied as it arrives, so its gathered bucket can be released."""
    from safetensors.torch import save_file

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    written: list[Path] = []
    pending: dict[str, torch.Tensor] = {}

    def flush() -> None:
        if pending:
            written.append(directory / f"weights-{len(written):05d}.safetensors")
            save_file(pending, str(written[-1]))
            pending.clear()

    for name, tensor in weights:
        pending[name] = tensor.detach().to("cpu", copy=True).contiguous()
        if sum(held.numel() * held.element_size() for held in pending.values()) >= flush_bytes:
            flush()
    flush()
    return written


class ServerTarget:
    """Generation from, and weights into, the run's vLLM server: a WeightTarget
    (rlhf_cli/rank/engines/weights.py) that takes whole weights only."""

    dense_reason = "the vLLM server reloads whole weight files"

    def __init__(self, args: Any, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.weight_dir = Path(args.output_dir, "vllm-weights")
        self.client = None
        self.dtype = None  # the server's: every sync into it is dense
        if accelerator.is_main_process:
            from trl.generation.vllm_client import VLLMClient

            self.client = VLLMClient(base_url=server_url(args), connection_timeout=args.vllm_server_timeout)
            if args.vllm_importance_sampling_correction:
                check_logprobs_mode(self.client)
        accelerator.wait_for_everyone()

    def generate(self, prompts: list[list[int]], settings: dict[str, Any]) -> tuple[list[list[int]], list[Any]]:
        """Completions of this rank's `prompts` and the log-probability of each sampled token (TRL's nesting: one
        list per token): rank 0 asks for every rank's at once."""
        from accelerate.utils import broadcast_object_list, gather_object

        everyone = gather_object([prompts])  # one list per rank, in rank order
        completions: list[Any] = [None]
        if self.client is not None:
            flat = [ids for rank_prompts in everyone for ids in rank_prompts]
            out = self.client.generate(prompts=flat, n=1, temperature=settings["temperature"],
                                       top_p=settings["top_p"], top_k=settings["top_k"], min_p=settings["min_p"],
                                       repetition_penalty=settings["repetition_penalty"],
                                       max_tokens=settings["max_completion_length"], logprobs=0,
                                       generation_kwargs=settings["generation_kwargs"])
            completions = [(out["completion_ids"], out["logprobs"])]
        broadcast_object_list(completions, from_process=0)
        start = sum(len(rank_prompts) for rank_prompts in everyone[:self.accelerator.process_index])
        ids, logprobs = completions[0]
        return ids[start:start + len(prompts)], logprobs[start:start + len(prompts)]

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Rank 0 writes the weights as they are gathered; the other ranks take part in the
        gathering only."""
        if self.client is None:
            for _ in weights:
                pass
            return
        write_weight_files(self.weight_dir, weights)

    def reset(self) -> None:
        """The server reloads the weight files, then forgets the prompts it cached under the old weights."""
        if self.client is not None:
            reload_server_weights(self.client.base_url, self.client.session, self.weight_dir)
        self.accelerator.wait_for_everyone()

    def patch(self, patches: list[Any]) -> None:
        raise NotImplementedError(self.dense_reason)

    def checksums(self) -> dict[str, tuple[int, int]]:
        return {}  # the server's weights are not readable from here: its dense reload is checked by the server

    def after_sync(self, model: Any, woke: bool) -> dict[str, Any]:
        return {}


def check_logprobs_mode(client: Any) -> None:
    """Refuse a server that reports other log-probabilities than those of the distribution it samples from (a server
    not started by `rlhf vllm-serve`): the importance-sampling weights would correct for the temperature."""
    mode = client.get_server_info()["model_config"]["logprobs_mode"]
    if mode != LOGPROBS_MODE:
        raise RuntimeError(f"the vLLM server at {client.base_url} reports `--logprobs-mode {mode}`, not the sampled "
                           f"distribution's ({LOGPROBS_MODE}) that PPO's importance sampling compares with the "
                           "policy's: restart it with `rlhf vllm-serve`, or set "
                           "vllm_importance_sampling_correction=false")


def reload_server_weights(base_url: str, session: Any, weight_dir: Path) -> None:
    from rlhf_cli.rank.engines.vllm.worker_extension import RELOAD_METHOD

    for path, body in (("collective_rpc", {"method": RELOAD_METHOD,
                                           "kwargs": {"weights_path": os.fspath(weight_dir.resolve())}}),
                       ("reset_prefix_cache", None)):
        response = session.post(f"{base_url}/{path}", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"the vLLM server at {base_url} refused /{path} ({response.status_code}): "
                               f"{response.text[:300]}; start it with `rlhf vllm-serve`, which turns on the "
                               "development endpoints the weight refresh uses")
