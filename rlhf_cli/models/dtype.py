"""The dtype the trainer holds the policy's weights in: what vLLM must be built in (colocated or a server), since
vLLM's `auto` builds a float32 checkpoint in bfloat16 and its samples would then not be the policy's. Pure Python:
`rlhf vllm-serve` asks it before any rank exists, the ranks when they build TRL's colocated engine."""

from __future__ import annotations

from typing import Any

from rlhf_cli.models.hub import local_config

DTYPES = ("float32", "float16", "bfloat16")


def training_dtype(bf16: bool, fp16: bool, load_dtype: Any, model_dir: Any) -> str:
    """DeepSpeed's bf16 or fp16 when on, else the dtype the policy is loaded in (`dtype` of the model's init
    arguments, or its checkpoint's config.json for auto), float32 when neither names one."""
    if bf16 or fp16:
        return "bfloat16" if bf16 else "float16"
    saved = local_config(str(model_dir))
    for named in (load_dtype, saved.get("dtype") or saved.get("torch_dtype")):
        if isinstance(named, str) and named in DTYPES:
            return named
    return "float32"
