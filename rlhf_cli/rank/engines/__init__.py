"""The ranks' side of each generation engine: the engine-neutral weight sync (weights.py, sync.py, delta.py)
and one folder per engine (`vllm/`); the policy's own `generate` (hf) needs none."""
