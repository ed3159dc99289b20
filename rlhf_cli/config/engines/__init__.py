"""A run's settings for each generation engine, read and checked before anything starts: `vllm` (TRL's `vllm_*`
keys, the installed version, lengths) and `vllm_server` (the server a run's ranks will talk to)."""
