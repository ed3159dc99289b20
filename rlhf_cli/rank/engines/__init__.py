"""The generation engines seen from a rank: the engine-neutral weight sync (weights.py, delta.py) and one folder per
engine (vllm/)."""
