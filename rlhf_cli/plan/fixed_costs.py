"""Eager PyTorch's fixed costs, counted in small module calls: what a run pays per generated token, per forward,
per optimizer step and per save whatever the model's size. On a 7B model on H100s they are under a tenth of a step
(HF decode's per-layer launches, mostly); on a small model, and on a CPU, they are most of it (the smoke recipes'
2-layer models spend nearly all their time in them).

A count times the seconds of one small module call from Python (`Rates.call`: measured by
`rlhf doctor --calibrate`, else assumed, rlhf_cli/plan/rates.py) is the seconds. The counts were measured with
transformers 5's llama on CPU, one thread, against a tiny nn.Linear's call in the same process: a 2-layer and a
6-layer model, HF generate of 12 and 24 tokens at batch 2, a forward, a forward and backward. The per-step and
per-call counts of a run's own machinery (TRL's generation context and ZeRO-3's gathering around `generate`, the
trainer's per-step work, DeepSpeed's step, a save) were fitted to the smoke recipes' measured phases
(benchmarks/plan_vs_measured.py). No torch.
"""

from __future__ import annotations

from rlhf_cli.plan.model_sizes import ModelSize

DECODE_LAYER_CALLS = 60  # one decoder layer in one decode step: its modules and functional ops
DECODE_TOKEN_CALLS = 100  # per generated token outside the layers: embedding, norm, head, logits processors, sampling
FORWARD_LAYER_CALLS = 55  # one decoder layer in a forward over a batch
FORWARD_CALLS = 70  # a forward outside the layers: embedding, masks, rotary tables, norm, head, the loss
BACKWARD_CALLS_PER_FORWARD = 2  # autograd's calls in a backward, per call of its forward (measured 1.7 to 1.8)
# Fitted to the smoke recipes (2 ranks, 2-layer models, gloo) with this machine's call measured at the same time:
GENERATE_CALLS = 13_000  # per generate call: TRL's generation context, ZeRO-3 gathering the policy and its hooks
STEP_CALLS = 8000  # per optimizer step: the trainer's rewards, advantages and logged metrics, DeepSpeed's step
SAVE_CALLS = 20_000  # per save, besides its bytes: the files written, the trainer's state, the ranks' barriers


def decode_token(model: ModelSize) -> int:
    """Calls per generated token (one decode step of the whole model)."""
    return DECODE_TOKEN_CALLS + DECODE_LAYER_CALLS * model.layers


def forward(model: ModelSize) -> int:
    """Calls of one forward over a batch."""
    return FORWARD_CALLS + FORWARD_LAYER_CALLS * model.layers


def forward_backward(model: ModelSize) -> int:
    """Calls of one forward and its backward."""
    return forward(model) * (1 + BACKWARD_CALLS_PER_FORWARD)
