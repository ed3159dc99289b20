"""PPO's rollouts from vLLM (`use_vllm`, `vllm_mode: colocate|server`): TRL's PPOTrainer never had them.

Colocate: TRL's own `VLLMGeneration` on every rank (its tensor-parallel groups, seeds and prompt exchange), the
engine GRPO and RLOO run. Server: rank 0 sends every rank's prompts to the run's vLLM server (`rlhf vllm-serve`)
through TRL's `VLLMClient` and hands each rank its share. Either way vLLM samples and says the log-probability of
each token it sampled; old log-probs, values and reference log-probs stay the policy's own forward passes, as with
`generate`, and the difference between vLLM's and the policy's log-probs is TRL's mismatch metrics and its
truncated importance-sampling correction (rlhf_cli/rank/ppo/core.py `sampling_correction`).

After every update (and, to a server, before the first rollout: `start`) the policy's weights go to vLLM (`sync`)
through rlhf's bucketed sync (rlhf_cli/rank/engines/weights.py), gathered under the run's gather choice: into the
colocated engine, or through a directory into the server.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from rlhf_cli.generation.choice import Engine, Generation
from rlhf_cli.rank.engines.sync import sync_weights
from rlhf_cli.rank.engines.vllm.self_check import SyncCheck
from rlhf_cli.rank.engines.vllm.server import ServerTarget
from rlhf_cli.rank.engines.vllm.target import ColocatedVLLM
from rlhf_cli.rank.engines.weights import SyncLimit
from rlhf_cli.rank.zero3 import GenerationClock


def sampling_settings(response_length: int, temperature: float, stop_token_id: int | None) -> dict[str, Any]:
    """vLLM's sampling of softmax(logits / temperature), as PPO's `generate` (rollout_generation_config): no top-k,
    top-p or repetition penalty, the model's own EOS ignored; stop at the stop token (kept in the response, as
    `generate` keeps it), or run to `response_length` without one."""
    return {"temperature": temperature + 1e-7, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
            "max_completion_length": response_length,
            "generation_kwargs": {"ignore_eos": True,
                                  "stop_token_ids": None if stop_token_id is None else [stop_token_id]}}


def prompt_ids(queries: torch.Tensor, pad_token_id: int) -> list[list[int]]:
    """The token ids of left-padded prompts without their left padding: a pad id inside a prompt (a tokenizer
    whose pad is its EOS or BOS) stays."""
    starts = (queries != pad_token_id).int().argmax(1)  # the first real token (0 for a row that is all padding)
    return [row[start:].tolist() for row, start in zip(queries, starts.tolist(), strict=True)]


def padded(rows: list[list[Any]], fill: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """vLLM's per-token lists as `generate` returns its tokens: right-padded to the longest with `fill`."""
    width = max(1, max(len(row) for row in rows))
    out = torch.full((len(rows), width), fill, dtype=dtype, device=device)
    for index, row in enumerate(rows):
        out[index, :len(row)] = torch.tensor(row, dtype=dtype, device=device)
    return out


def sampled_logprobs(logprobs: list[list[list[float | None]]]) -> list[list[float]]:
    """The log-probability vLLM gave each token it sampled (TRL's `logprobs=0`: the sampled token's alone); a
    token vLLM could not score is NaN, as in TRL."""
    return [[float("nan") if step[0] is None else step[0] for step in row] for row in logprobs]


class VLLMRollouts:
    """Samples PPO's responses with vLLM and refreshes its weights after every update."""

    def __init__(self, args: Any, accelerator: Any, policy: nn.Module, tokenizer: Any, stop_token_id: int | None,
                 generation: Generation, check_every: int, delta: bool = True) -> None:
        self.args, self.accelerator, self.policy = args, accelerator, policy
        self.check = SyncCheck(check_every)  # of the colocated engine's syncs (self_check.py)
        self.delta = delta  # `weight_sync_delta`: False sends every weight at every sync
        self.pad_token_id = tokenizer.pad_token_id
        self.limit = SyncLimit.of(generation.gather, policy)
        self.settings = sampling_settings(args.response_length, args.temperature, stop_token_id)
        self.generation_seconds: list[float] = []  # of every call, for the rank record
        self.server = ServerTarget.of_args(args, accelerator) if generation.engine == Engine.server else None
        self.generation = self._colocated(tokenizer) if self.server is None else None

    @classmethod
    def of_trainer(cls, trainer: Any, generation: Generation, sync_check_steps: int,
                   sync_delta: bool) -> VLLMRollouts:
        """PPO's rollouts face (rlhf_cli/rank/ppo/rollouts.py), for a PPO trainer's policy and settings."""
        return cls(trainer.args, trainer.accelerator, trainer.policy_and_value.policy, trainer.processing_class,
                   trainer.stop_token_id, generation, sync_check_steps, sync_delta)

    def _colocated(self, tokenizer: Any) -> Any:
        from trl.generation.vllm_generation import VLLMGeneration

        args = self.args
        settings = {key: value for key, value in self.settings.items() if key != "generation_kwargs"}
        return VLLMGeneration(
            model=self.policy, accelerator=self.accelerator, processing_class=tokenizer, mode="colocate",
            tensor_parallel_size=args.vllm_tensor_parallel_size,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization, max_model_length=args.vllm_max_model_length,
            max_num_seqs=args.local_rollout_forward_batch_size * args.vllm_tensor_parallel_size,
            enable_sleep_mode=args.vllm_enable_sleep_mode, model_impl=args.vllm_model_impl,
            trust_remote_code=args.trust_remote_code, logprobs=0,
            generation_kwargs=self.settings["generation_kwargs"], **settings)

    @torch.no_grad()
    def generate(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Responses to left-padded `queries`, right-padded with the pad token, and the log-probability vLLM
        sampled each response token with (at the rollout temperature; 0 past a response's end)."""
        started = time.perf_counter()
        prompts = prompt_ids(queries, self.pad_token_id)
        if self.generation is not None:
            _, completions, logprobs, _ = self.generation.generate(prompts, None, num_generations=1)
        else:
            completions, logprobs = self.server.generate(prompts, self.settings)
        seconds = time.perf_counter() - started
        GenerationClock.seconds += seconds
        self.generation_seconds.append(seconds)
        return (padded([list(ids) for ids in completions], self.pad_token_id, torch.long, queries.device),
                padded(sampled_logprobs(logprobs), 0.0, torch.float32, queries.device))

    def start(self, resumed: bool) -> None:
        """Before the first rollout: a colocated engine loaded the starting weights itself and needs the policy's
        only after a resume (the checkpoint's); a server holds whatever it was last sent, maybe by an earlier run,
        so it always gets this run's weights before it samples for it."""
        if resumed or self.server is not None:
            self.sync()

    def sync(self) -> dict[str, float]:
        """Send the policy's weights to vLLM; the seconds and the most policy bytes gathered at once, for the log.
        A sleeping colocated engine dropped its weights: its next `generate` sends them (TRL's VLLMGeneration)."""
        if self.generation is not None and self.args.vllm_enable_sleep_mode:
            return {}
        target = ColocatedVLLM.of(self.generation.llm, self.check) if self.generation is not None else self.server
        measured = sync_weights(self.policy, target, self.limit, delta=self.delta)
        checked = {"vllm/sync_check_logp_difference": measured["check_logp_difference"]} \
            if "check_logp_difference" in measured else {}
        return {"vllm/sync_seconds": measured["seconds"], "vllm/sync_peak_bytes": float(measured["peak_bytes"]),
                **checked}
