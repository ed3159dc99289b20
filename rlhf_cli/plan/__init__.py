"""The memory and time plan: will a run fit on its GPUs, how long will each step take, with which gather and
offload choices?

Modules: `model_sizes` (parameter counts from config.json), `memory` (the formulas, pure functions),
`hardware` (GPU memory given, detected, or this machine's RAM), `workload` (lengths and batch sizes from the
trainer's fields), `inputs` (what the arithmetic reads from a resolved run), `columns` (a plan's candidates, columns
and JSON form), `estimate` (a resolved run -> its plan, and `gather: auto`), `time`, `rates` (seconds per optimizer
step by phase), `summary` (the fastest and smallest in words); `engines/` holds each generation engine's rows
(`engines/vllm`: vLLM's share of a GPU and its weight sync; `vllm_search`, `vllm_time`).
Nothing here imports torch, transformers, deepspeed or accelerate.

`rlhf plan ALGO ... --json` prints `Plan.as_dict()`:
- `known`: false when no plan could be made; `why_unknown` then says why, and nothing else follows.
- `gpu_memory` (bytes per GPU), `gpus_per_machine`, `machines`, `hardware_source` (where the memory came from),
  `margin` (the share of a GPU's memory a configuration must leave free to fit).
- `models`: role (policy, reference, reward, value) -> `name_or_path`, `params`, `largest_layer`, `trained`,
  `adapter_params` (a trained model's LoRA parameters, as the LoRA configurations count them; else null).
- `workload`: `prompt_length`, `completion_length`, `generation_batch`, `train_batch`, `score_batch`,
  `train_sequence`, `gradient_checkpointing`, `element_bytes`, `attention` (attn_implementation), `liger`
  (use_liger_kernel), `logits` (how the trainer scores tokens: `sequence_copies`, `completion_copies`,
  `fused_head`).
- `configurations`: one object per candidate: `label`, `gather`, `gather_budget` (a budget's text, or null),
  `engine` (`hf`: the policy generates; `vllm`: vLLM does, and `gather`/`gather_budget` size its weight sync),
  `vllm` (its settings: `mode`, `gpu_memory_utilization`, `tensor_parallel_size`, `sleep`, `sleep_level`,
  `enforce_eager`; null for hf),
  `lora` (adapters on the trained models, frozen base, no reference copy), `offload_optimizer`, `offload_params`,
  `components` (row name -> GPU bytes), `phases` (`static`, `generation`, `training`, `step`, `sync` -> the GPU bytes
  of their rows), `peak_gpu` (bytes: static rows + the largest of the generation, training, optimizer-step and sync
  rows), `cpu_per_machine` (bytes of offloaded states), `fits`, `chosen` (the run's own), `generation` (how it
  generates, in words), `time` and `step_seconds` (seconds per optimizer step by phase: rlhf_cli/plan/time.py;
  null without a known GPU).
- `gpu` (the rates timed on and their source; null: none known), `fastest` and `smallest` (labels of the fitting
  configurations with the fewest seconds per step and the least peak; null when none fits or none is timed).
- `checkpoint_bytes`: one checkpoint on disk, every trained model's weights and optimizer states.
- `reason`: one line on the chosen configuration; `suggestions`: what would fit when it does not;
  `notes`: caveats (an architecture counted approximately); `largest_generation_batch`: the most sequences one
  GPU can generate together with the chosen configuration (null: not even one); `vllm_findings`: what colocated
  vLLM means for the run and the first colocated configuration that fits, or why none does.
"""
