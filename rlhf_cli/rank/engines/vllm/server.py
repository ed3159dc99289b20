"""A run's vLLM server seen from the ranks (`vllm_mode: server`): generation through it, and its weight refresh.

Rank 0 holds TRL's `VLLMClient` (the server's OpenAI-compatible `/v1/completions`); every rank's prompts go to it in
one request and each rank gets its share back. Weights reach the server through a directory both can read. A dense
sync: rank 0 writes them as each bucket is gathered, then asks the server to reload from the directory (`POST
/collective_rpc` `rlhf_reload_weights`, rlhf_cli/rank/engines/vllm/worker_extension.py, through a development
endpoint: `rlhf vllm-serve` starts the server with VLLM_SERVER_DEV_MODE=1 and that extension). A delta sync
(rlhf_cli/rank/engines/delta.py): rank 0 writes each bucket's patches to one file (patch_files.py) and the server
writes them into its weights through vLLM's checkpoint-coordinate loader, as the colocated engine does. After
either, the run compares the server's weight checksums with its own, as it does a colocated engine's, then tells the
server the sync is whole and has it drop its prefix cache. Where the server serves the run's LoRA (server_lora.py),
the first sync reloads the unmerged base and every sync then sends the adapters alone, checked the same way. PPO,
RLOO, GRPO and online DPO sync a server the same way (rlhf_cli/rank/engines/vllm/sync.py): TRL's NCCL weight
transfer needs CUDA on both sides, the directory works everywhere (and is the one tested on CPU). Rank 0 alone talks
to the server; what it answers (dtype, checksums, a refused patch) goes to every rank, whose sync decides alike.

Each whole sync is given a weight version (this run's, and the count of its syncs) that the server keeps (a
reload or a patch drops it until the sync is whole): before its first generation a run checks that the server
holds the version it last sent, so that a server serving one run after another never samples from an earlier
run's weights.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import torch

import rlhf_cli.rank.engines.vllm.worker_extension as worker
from rlhf_cli.config.engines.vllm import LOGPROBS_MODE
from rlhf_cli.config.engines.vllm_lora import LoraServing
from rlhf_cli.rank.engines.vllm.patch_files import write_patch_file
from rlhf_cli.rank.engines.vllm.server_lora import ServerLora, drop_served_lora

WEIGHT_DIR = "vllm-weights"  # under the run's output directory: the trainer writes, the server reads
PATCH_FILE = "patches.safetensors"  # in WEIGHT_DIR: the bucket of patches being applied
FLUSH_BYTES = 512 * 2**20  # rank 0 writes a weight file whenever it holds this much: its host memory stays bounded


def server_url(args: Any) -> str:
    return args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"


def wait_for_server(health_url: str, total_timeout: float, retry_interval: float = 2.0) -> Any:
    """The server's 200 reply to `health_url`, polled every `retry_interval` s; after `total_timeout` s without
    one (`vllm_server_timeout`), whatever answered, a ConnectionError that says what did."""
    import requests

    deadline = time.monotonic() + total_timeout
    while True:
        try:
            reply = requests.get(health_url, timeout=max(1.0, min(30.0, deadline - time.monotonic())))
            if reply.status_code == 200:
                return reply
            last = f"HTTP {reply.status_code}"
        except requests.RequestException as error:
            last = f"no answer ({type(error).__name__})"
        if time.monotonic() >= deadline:
            raise ConnectionError(f"the vLLM server did not answer 200 at {health_url} within {total_timeout:g} s "
                                  f"(`vllm_server_timeout`; last: {last}); start it with `rlhf vllm-serve`, or fix "
                                  "the run's server address")
        time.sleep(max(0.0, min(retry_interval, deadline - time.monotonic())))


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
    (rlhf_cli/rank/engines/weights.py) that takes whole weights and patches, through the run's directory, and,
    where it serves the run's LoRA, the adapters alone (server_lora.py)."""

    instead = "with --vllm colocate or without --vllm"
    # the run's LoRA decision (rlhf_cli/config/engines/vllm_lora.py), set once when the ranks install vLLM
    # (rlhf_cli/rank/engines/vllm/sync.py install_vllm): a process trains one run
    lora: ClassVar[LoraServing | None] = None

    def __init__(self, client: Any | None, accelerator: Any | None, weight_dir: Path) -> None:
        """`client`: TRL's `VLLMClient` on rank 0, None on the other ranks; `accelerator` None: a client that only
        checks the version before it generates."""
        self.accelerator = accelerator
        self.weight_dir = weight_dir
        self.client = client
        self.run_id = uuid.uuid4().hex  # rank 0's is the one the server is told
        self.syncs = 0
        self.checked = False
        served = self.lora is not None and self.lora.served
        self.adapters = ServerLora(self, self.lora.max_rank) if served else None  # None: it holds the policy merged
        self.lora_reason = self.lora.reason if self.lora is not None else None
        if client is not None:  # what TRL's client checks before it generates (rlhf_cli/rank/engines/vllm/sync.py)
            client.rlhf_server_target = self

    @classmethod
    def of_args(cls, args: Any, accelerator: Any) -> ServerTarget:
        """The target of a run's training arguments (`vllm_server_*`, `output_dir`)."""
        client = None
        if accelerator.is_main_process:
            from trl.generation.vllm_client import VLLMClient

            client = VLLMClient(base_url=server_url(args), connection_timeout=args.vllm_server_timeout)
            if args.vllm_importance_sampling_correction:
                check_logprobs_mode(client)
        accelerator.wait_for_everyone()
        return cls(client, accelerator, Path(args.output_dir, WEIGHT_DIR))

    @functools.cached_property
    def _workers_dtypes(self) -> list[str]:
        """The dtype of each of the server's workers, asked at the first sync (every rank syncs)."""
        return self.from_server(lambda: _post(self.client.base_url, self.client.session, "collective_rpc",
                                               {"method": worker.DTYPE_METHOD})["results"])

    @property
    def dtype(self) -> Any:
        """The torch dtype the server holds its weights in."""
        return getattr(torch, self._workers_dtypes[0])

    @property
    def dense_reason(self) -> str | None:
        """Why the server takes no patches (its weights split over several workers), or None."""
        workers = len(self._workers_dtypes)
        return None if workers == 1 else (f"the vLLM server splits its weights over {workers} workers (tensor "
                                          "parallel): it reloads whole weight files")

    @property
    def version(self) -> str:
        """The version of the weights this run last sent the server."""
        return f"{self.run_id}:{self.syncs}"

    def check_version(self) -> None:
        """Before the first generation (rank 0): the server must hold the weights this run last sent it."""
        if self.client is None or self.checked:
            return
        held = server_weight_version(self.client.base_url, self.client.session)
        ours = self.version if self.syncs else "none yet"
        if self.syncs == 0 or set(held) != {self.version}:
            raise RuntimeError(f"the vLLM server at {self.client.base_url} holds weights this run did not send "
                               f"(version {', '.join(map(str, held))}, this run's {ours}); a run syncs its server "
                               "before it generates: is another run using it?")
        self.checked = True

    def generate(self, prompts: list[list[int]], settings: dict[str, Any]) -> tuple[list[list[int]], list[Any]]:
        """Completions of this rank's `prompts` and the log-probability of each sampled token (TRL's nesting: one
        list per token): rank 0 asks for every rank's at once."""
        from accelerate.utils import broadcast_object_list, gather_object

        everyone = gather_object([prompts])  # one list per rank, in rank order
        completions: list[Any] = [None]
        if self.client is not None:
            self.check_version()
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
        """Rank 0 writes the weights as they are gathered, and the server reloads them; the other ranks take part
        in the gathering only."""
        if self.client is None:
            for _ in weights:
                pass
            return
        write_weight_files(self.weight_dir, weights)
        self.rpc(worker.RELOAD_METHOD, {"weights_path": os.fspath(self.weight_dir.resolve())})
        drop_served_lora(self.client)  # the weights sent are the policy's whole (merged, or the base of its LoRA)

    def patch(self, patches: list[Any]) -> None:
        """Rank 0 writes one bucket's patches and the server applies them; every rank raises NotImplementedError
        when the server cannot take them."""
        def apply() -> str | None:
            path = write_patch_file(self.weight_dir / PATCH_FILE, patches)
            return _post(self.client.base_url, self.client.session, "collective_rpc", {
                "method": worker.PATCH_METHOD, "kwargs": {"patches_path": os.fspath(path.resolve())}})["results"][0]

        refused = self.from_server(apply)
        if refused:
            raise NotImplementedError(refused)

    def checksums(self, groups: set[str] | None = None) -> dict[str, tuple[int, int]]:
        """The server's weight checksums (its one worker's; of `groups`, or all), on every rank."""
        asked = {"groups": sorted(groups)} if groups is not None else {}
        found = self.from_server(lambda: _post(self.client.base_url, self.client.session, "collective_rpc",
                                                {"method": worker.CHECKSUM_METHOD, "kwargs": asked})["results"][0])
        return {name: (int(sums[0]), int(sums[1])) for name, sums in found.items()}

    def reset(self) -> None:
        """The sync is whole: the server keeps this run's new version and forgets the prompts it cached under the
        old weights."""
        if self.client is not None:
            self.syncs += 1
            commit_server_weights(self.client.base_url, self.client.session, self.version)
        self.accelerator.wait_for_everyone()

    def from_server(self, ask: Callable[[], Any]) -> Any:
        """What rank 0 learns from the server (`ask`), on every rank."""
        import torch.distributed as dist

        answer = [ask() if self.client is not None else None]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(answer, src=0)
        return answer[0]

    def rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> Any:
        """Rank 0 asks the server's workers to run `method` of worker_extension.py; their answer."""
        return _post(self.client.base_url, self.client.session, "collective_rpc",
                     {"method": method, **({"kwargs": kwargs} if kwargs else {})})

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


def commit_server_weights(base_url: str, session: Any, version: str) -> None:
    """The server keeps `version` as the weights it holds, then drops its prefix cache."""
    _post(base_url, session, "collective_rpc", {"method": worker.COMMIT_METHOD, "kwargs": {"version": version}})
    _post(base_url, session, "reset_prefix_cache", None)


def server_weight_version(base_url: str, session: Any) -> list[str | None]:
    """The weight version each of the server's workers holds (None: none since it started)."""
    return _post(base_url, session, "collective_rpc", {"method": worker.VERSION_METHOD})["results"]


def _post(base_url: str, session: Any, path: str, body: dict[str, Any] | None) -> Any:
    response = session.post(f"{base_url}/{path}", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"the vLLM server at {base_url} refused /{path} ({response.status_code}): "
                           f"{response.text[:300]}; start it with `rlhf vllm-serve`, which turns on the "
                           "development endpoints the weight refresh uses")
    return response.json() if response.content else None
