"""Seconds per optimizer step of one planned configuration, split by phase, from FLOPs and bytes over the GPU's rates.

JSON shape (`rlhf plan ... --json`; under `plan` in `--dry-run --json`), kept stable for the run's record to put
measured beside predicted:
- every object of `configurations` gains `time` and `step_seconds`:
  `time`: {"generation": s, "weight_sync": s, "scoring": s, "training": s, "optimizer_step": s, "saving": s,
  "waiting": s}, seconds per optimizer step on one GPU (every GPU does the same work under ZeRO-3), floats;
  `step_seconds`: their sum. The run's own configuration is the one with `"chosen": true`.
- the plan gains `gpu`: {"name", "source", "bf16_flops", "memory_bandwidth", "interconnect",
  "interconnect_bandwidth", "host_bandwidth"} (FLOP/s and bytes/s), and `fastest` / `smallest`: the labels of
  the fitting configuration with the least `step_seconds` and the one with the least `peak_gpu` (null when none
  fits).
Phase keys (PHASES): `generation` (sampling the rollouts: HF generate or vLLM), `weight_sync` (refreshing vLLM's
weights), `scoring` (no-grad forwards: reference, reward, value, old log-probs), `training` (the policy's, and
PPO's value model's, forward and backward with ZeRO-3's all-gathers and reduce-scatter), `optimizer_step` (Adam on
the GPU, or on the CPU with its PCIe traffic when offloaded, NVMe when there), `saving` (a checkpoint's write
amortised over `save_steps`), `waiting` (on other ranks: 0, no imbalance is modelled).
"""
