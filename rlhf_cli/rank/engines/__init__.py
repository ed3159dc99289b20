"""The ranks' side of each generation engine, one folder per engine (`vllm/`); the policy's own `generate` (hf)
needs none."""
