"""The ranks' side of vLLM: the weight sync from ZeRO-3 shards, the server transport, PPO's rollouts from vLLM."""
