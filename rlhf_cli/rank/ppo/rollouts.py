"""PPO's rollouts face: the one object the trainer asks for responses, whatever engine samples them.

Each engine's row in the registry (rlhf_cli/generation/engines.py) names its class under the `ppo_rollouts` face;
`rollouts_for` builds it. `HFRollouts` here is the policy's own `generate` inside the trainer (TRL's default); the
vLLM class lives in its room (rlhf_cli/rank/engines/vllm/ppo_rollouts.py).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn
from trl.models import unwrap_model_for_generation

from rlhf_cli.algorithms.spec import load_object
from rlhf_cli.generation.choice import GATHER_KEY, Generation
from rlhf_cli.rank.ppo.modules import only_this_generation_config, rollout_generation_config

ROLLOUTS_FACE = "ppo_rollouts"  # the face of an engine row that names its PPO rollouts class
PPOTrainer = Any  # rlhf_cli/rank/ppo/trainer.py's, which imports this module


class Rollouts(Protocol):
    """What PPO asks of the engine that samples its rollouts."""

    generation_seconds: list[float] | None  # each generation call's, for the rank record (None: not timed apart)

    def generate(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Responses to left-padded `queries`, right-padded with the pad token; and the log-probability the
        engine sampled each token with, when it is not the policy itself (None: the policy's own)."""

    def start(self, resumed: bool) -> None:
        """Before the first rollout (after a resume, `resumed`): bring the engine the policy's weights if it
        needs them."""

    def sync(self) -> dict[str, float]:
        """After every update: bring the engine the policy's new weights; what to log about it."""


def rollouts_for(trainer: PPOTrainer, generation: Generation, sync_check_steps: int,
                 sync_delta: bool = True) -> Rollouts:
    """The rollouts of the run's engine, the class its registry row names; an engine with weights of its own syncs
    them as `vllm_sync_check_steps` (`sync_check_steps`) and `weight_sync_delta` (`sync_delta`) say."""
    rollouts_class = load_object(generation.engine.spec.faces[ROLLOUTS_FACE])
    return rollouts_class.of_trainer(trainer, generation, sync_check_steps, sync_delta)


class HFRollouts:
    """The policy's own `generate`, gathered as the run's gather choice says (TRL's `ds3_gather_for_generation`):
    it samples from the very weights it trains, so there is nothing to sync."""

    def __init__(self, trainer: PPOTrainer) -> None:
        self.trainer = trainer  # its wrapped model changes when training starts: read at every call
        self.generation_seconds = None  # each call is timed by the GenerationClock (rlhf_cli/rank/zero3.py)

    @classmethod
    def of_trainer(cls, trainer: PPOTrainer, generation: Generation, sync_check_steps: int,
                   sync_delta: bool) -> HFRollouts:
        return cls(trainer)

    @torch.no_grad()
    def generate(self, queries: torch.Tensor) -> tuple[torch.Tensor, None]:
        trainer = self.trainer
        args, pad_id = trainer.args, trainer.processing_class.pad_token_id
        context_length = queries.size(1)
        generation_config = rollout_generation_config(args.response_length, args.temperature, pad_id,
                                                      trainer.stop_token_id)
        chunk = args.local_rollout_forward_batch_size
        responses = []
        trainer.policy_and_value.eval()  # in train mode with checkpointing, transformers would generate without cache
        with (unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                          gather_deepspeed3_params=getattr(args, GATHER_KEY),
                                          gradient_checkpointing_kwargs=args.activation_checkpointing_kwargs)
              as unwrapped,
              only_this_generation_config(unwrapped.policy, generation_config)):
            for start in range(0, queries.size(0), chunk):
                query = queries[start:start + chunk]
                out = unwrapped.policy.generate(input_ids=query, attention_mask=query != pad_id,
                                                generation_config=generation_config)
                responses.append(out[:, context_length:])
        # A chunk ends early when all its sequences stopped: pad every chunk to the longest.
        width = max(response.size(1) for response in responses)
        return torch.cat([nn.functional.pad(response, (0, width - response.size(1)), value=pad_id)
                          for response in responses]), None

    def start(self, resumed: bool) -> None:
        return None

    def sync(self) -> dict[str, Any]:
        return {}
