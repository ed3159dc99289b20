"""A run's vLLM server serving the policy's LoRA itself (rlhf_cli/config/engines/vllm_lora.py decides it; `rlhf
vllm-serve` starts the server with vLLM's LoRA and runtime adapter loading): the server holds the base, synced once
unmerged through the run's weight directory (rlhf_cli/rank/engines/vllm/server.py), and each sync's adapters
(rlhf_cli/rank/engines/adapters.py) reach it as a PEFT-format adapter in the run's directory, loaded by vLLM's own
`POST /v1/load_lora_adapter` in place of the last one.

The adapter is loaded under the name of the server's model: vLLM serves a request naming a loaded LoRA with that
LoRA before it looks at the base models (vLLM 0.30, BaseServing._maybe_get_adapters), so every request TRL's
client sends (it names the model, never a LoRA) is served with the run's current adapters, the server choosing
them. The server's worker reports the checksums of the LoRA it serves (worker_extension.py), which the sync
compares with what it sent (`check_adapters`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import rlhf_cli.rank.engines.vllm.worker_extension as worker
from rlhf_cli.config.engines.vllm_server import served_lora_problem
from rlhf_cli.rank.engines.vllm.adapters import LORA_DIR, write_adapter

SERVER_ADAPTER = "server"  # under the run's LORA_DIR: the adapter the server loads, rewritten every sync


class ServerLora:
    """The LoRA the run's vLLM server serves the policy's adapters as (rlhf_cli/rank/engines/weights.AdapterServer),
    of the ServerTarget `target` (rank 0 talks to the server, every rank gets its answers)."""

    def __init__(self, target: Any, max_rank: int) -> None:
        self.target = target
        self.max_rank = max_rank
        client = target.client
        if client is not None:
            problem = served_lora_problem(client.get_server_info(), max_rank,
                                          f"the vLLM server at {client.base_url}", "ALGORITHM")
            if problem:
                raise RuntimeError(problem)

    @property
    def directory(self) -> Path:
        return self.target.weight_dir.parent / LORA_DIR / SERVER_ADAPTER

    def load(self, packed: Any) -> None:
        """Rank 0 writes `packed` (adapters.PackedAdapters) as a PEFT adapter and the server serves it from its
        next request on, under its model's name, in place of the last one."""
        def send() -> None:
            client = self.target.client
            path = write_adapter(self.directory, packed)
            reply = client.session.post(f"{client.base_url}/v1/load_lora_adapter", json={
                "lora_name": client.model, "lora_path": os.fspath(path.resolve()), "load_inplace": True})
            if reply.status_code != 200:
                raise RuntimeError(f"the vLLM server at {client.base_url} did not load the run's LoRA "
                                   f"(/v1/load_lora_adapter: {reply.status_code} {reply.text[:300]}); restart it "
                                   "with `rlhf vllm-serve` and the run's recipe and --lora, which turns on vLLM's "
                                   "LoRA and its runtime adapter loading")

        self.target.from_server(send)

    def checksums(self) -> dict[str, tuple[int, int]] | None:
        """`bit_sums` of the adapter matrices the server serves, by vLLM's names; None where its weights are split
        over several workers (tensor parallel: each serves slices)."""
        found = self.target.from_server(lambda: self.target.rpc(worker.LORA_CHECKSUM_METHOD)["results"])
        if len(found) != 1:
            return None
        return {name: (int(sums[0]), int(sums[1])) for name, sums in found[0].items()}


def drop_served_lora(client: Any) -> None:
    """The server serves its model without the LoRA an earlier sync loaded under its name (a dense reload: the
    adapters, if the run serves them, come after); nothing where it holds none or loads none at run time."""
    reply = client.session.post(f"{client.base_url}/v1/unload_lora_adapter", json={"lora_name": client.model})
    if reply.status_code not in (200, 404):
        raise RuntimeError(f"the vLLM server at {client.base_url} did not drop the LoRA it serves "
                           f"(/v1/unload_lora_adapter: {reply.status_code} {reply.text[:300]})")
