"""What `rlhf vllm-serve` adds to the server's vLLM worker (`--worker-extension-cls`): the disk reload a run's weight
refresh asks for (`POST /collective_rpc`, rlhf_cli/rank/engines/vllm/server.py), with the layers that share a reloaded
weight re-processed after it, as the colocated reload does (rlhf_cli/compat/vllm.vllm_reprocess_shared_layers): vLLM's
own `reload_weights` leaves a tied LM head as it was at load. And the version of the weights it holds, which a run
checks before its first generation (rlhf_cli/rank/engines/vllm/server.ServerTarget.check_version)."""

from __future__ import annotations

from typing import Any

from rlhf_cli.compat import vllm as vllm_compat

RELOAD_METHOD = "rlhf_reload_weights"
VERSION_METHOD = "rlhf_weight_version"


class ReloadWithTiedLayers:
    """Mixed into vLLM's worker class by vLLM itself; `self` is the worker."""

    model_runner: Any
    rlhf_version: str | None = None  # the model's own weights, as loaded at start

    def rlhf_reload_weights(self, weights_path: str, version: str | None = None) -> list[str]:
        """Reload every weight from the safetensors files under `weights_path`, which are `version`; the layers
        re-processed after."""
        self.rlhf_version = None  # a reload that fails midway leaves no run's weights
        self.model_runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        reprocessed = vllm_compat.vllm_reprocess_shared_layers(self.model_runner.get_model())
        self.rlhf_version = version
        return reprocessed

    def rlhf_weight_version(self) -> str | None:
        """The version of the weights last reloaded, None for the model's own."""
        return self.rlhf_version
