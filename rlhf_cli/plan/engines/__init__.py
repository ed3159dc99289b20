"""The plan's rows for each generation engine: `vllm` (vLLM's share of a GPU and its weight sync), `vllm_search`
(the first colocated vLLM configuration that fits), `vllm_time` (its generation and sync seconds)."""
