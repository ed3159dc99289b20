"""Which causal LMs vLLM 0.30 serves through its Transformers backend: read by the colocate check
(rlhf_cli/config/engines/vllm.py) and by the LoRA decision (rlhf_cli/config/engines/vllm_lora.py), whose module
imports the other. No torch, no vLLM.
"""

from __future__ import annotations

# vllm/model_executor/models/registry.py `_TRANSFORMERS_SUPPORTED_MODELS` (tests/test_vllm_config.py compares them
# where vLLM is installed); the backend's model classes declare SupportsLoRA
TRANSFORMERS_BACKEND = frozenset({
    "FlexOlmoForCausalLM", "GPTBigCodeForCausalLM", "HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM",
    "NanbeigeForCausalLM", "OlmoForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM", "SmolLM3ForCausalLM",
    "Starcoder2ForCausalLM", "VaultGemmaForCausalLM"})
