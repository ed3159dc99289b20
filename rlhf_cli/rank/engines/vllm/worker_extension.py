"""What `rlhf vllm-serve` adds to the server's vLLM worker (`--worker-extension-cls`): the disk reload a run's weight
refresh asks for (`POST /collective_rpc`, rlhf_cli/rank/engines/vllm/server.py), with the layers that share a reloaded
weight re-processed after it, as the colocated reload does (rlhf_cli/compat/vllm.vllm_reprocess_shared_layers): vLLM's
own `reload_weights` leaves a tied LM head as it was at load."""

from __future__ import annotations

from typing import Any

from rlhf_cli.compat import vllm as vllm_compat

RELOAD_METHOD = "rlhf_reload_weights"


class ReloadWithTiedLayers:
    """Mixed into vLLM's worker class by vLLM itself; `self` is the worker."""

    model_runner: Any

    def rlhf_reload_weights(self, weights_path: str) -> list[str]:
        """Reload every weight from the safetensors files under `weights_path`; the layers re-processed after."""
        self.model_runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return vllm_compat.vllm_reprocess_shared_layers(self.model_runner.get_model())
