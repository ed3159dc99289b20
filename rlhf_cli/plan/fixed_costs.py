"""Eager PyTorch's fixed costs, counted in small module calls: what a run pays per generated token, per forward,
per optimizer step and per save whatever the model's size. On a 7B model on H100s they are under a tenth of a step
(HF decode's per-layer launches, mostly); on a small model, and on a CPU, they are most of it (the smoke recipes'
2-layer models spend nearly all their time in them).

A count times the seconds of one small module call from Python (`Rates.call`: measured by
`rlhf doctor --calibrate`, else assumed, rlhf_cli/plan/rates.py) is the seconds. The counts were measured with
transformers 5's llama on CPU, one thread, against a tiny nn.Linear's call in the same process: a 2-layer and a
6-layer model, HF generate of 12 and 24 tokens at batch 2, a forward, a forward and backward. The per-step and
per-call counts of a run's own machinery (TRL's generation context and ZeRO-3's gathering around `generate`, a
ZeRO-3's hooks on modules it keeps whole, the trainer's per-step work, DeepSpeed's step, a save) were fitted to the
smoke recipes' measured phases on a quiet machine (benchmarks/plan_vs_measured.py); a gather budget's own work was
timed in the ranks. No torch.
"""

from __future__ import annotations

from rlhf_cli.plan.model_sizes import ModelSize

DECODE_LAYER_CALLS = 60  # one decoder layer in one decode step: its modules and functional ops
DECODE_TOKEN_CALLS = 100  # per generated token outside the layers: embedding, norm, head, logits processors, sampling
FORWARD_LAYER_CALLS = 55  # one decoder layer in a forward over a batch
FORWARD_CALLS = 70  # a forward outside the layers: embedding, masks, rotary tables, norm, head, the loss
BACKWARD_CALLS_PER_FORWARD = 2  # autograd's calls in a backward, per call of its forward (measured 1.7 to 1.8)
# Fitted to the medians of the smoke recipes' measured phases in 5 interleaved rounds on a quiet 2-core machine
# (2 ranks, 2-layer models, gloo; benchmarks/results/plan_vs_measured.md), with its call measured at 6.48 us:
GENERATE_CALLS = 4800  # per generate call: TRL's generation context, ZeRO-3 gathering the policy and its hooks
STEP_CALLS = 10_300  # per optimizer step: the trainer's rewards, advantages and logged metrics, DeepSpeed's step
SAVE_CALLS = 10_700  # per save, besides its bytes: the files written, the trainer's state, the ranks' barriers
# per module of the policy per generate call under a gather budget: its units found and chosen (a walk over the
# modules), gathered, their hooks taken off and registered again. Timed in the smoke ranks (2 CPU ranks, rloo/smoke,
# 5 generate calls x 3 runs a choice, medians): 1.6 ms a call (0.5 finding, 0.2 entering, 0.9 leaving), against
# 0.38 ms per hooked module and forward in the same runs (no-gather's and the budget's generate less gather's, over
# 32 and 18 hooked modules x 12 forwards), so 4.3 hooked module-forwards x ZERO3_HOOK_CALLS over the policy's 29
# modules: 3 calls a module.
BUDGET_MODULE_CALLS = 3
# per module run under ZeRO-3's hooks with nothing to fetch (its parameters below the persistence threshold, kept
# whole): the hooks' bookkeeping, the trace; fitted to no-gather's generation, whose 2-layer policy fetches nothing
ZERO3_HOOK_CALLS = 21  # per module run under ZeRO-3's hooks with nothing to fetch (parameters kept whole)


def decode_token(model: ModelSize) -> int:
    """Calls per generated token (one decode step of the whole model)."""
    return DECODE_TOKEN_CALLS + DECODE_LAYER_CALLS * model.layers


def forward(model: ModelSize) -> int:
    """Calls of one forward over a batch."""
    return FORWARD_CALLS + FORWARD_LAYER_CALLS * model.layers


def forward_backward(model: ModelSize) -> int:
    """Calls of one forward and its backward."""
    return forward(model) * (1 + BACKWARD_CALLS_PER_FORWARD)
