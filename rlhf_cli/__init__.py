"""rlhf: launch PPO, RLOO and online DPO under DeepSpeed ZeRO-3 with gather and offload as flags."""

__version__ = "0.1.0"
