"""What `rlhf vllm-serve` adds to the server's vLLM worker (`--worker-extension-cls`), asked for by a run's weight
sync (`POST /collective_rpc`, rlhf_cli/rank/engines/vllm/server.py): the disk reload of a dense sync, with the
layers that share a reloaded weight re-processed after it, as the colocated reload does
(rlhf_cli/compat/vllm.vllm_reprocess_shared_layers: vLLM's own `reload_weights` leaves a tied LM head as it was at
load); a delta sync's patches, through vLLM's checkpoint-coordinate loader as the colocated engine takes them
(rlhf_cli/compat/vllm.vllm_apply_patches); the checksums of the weights it holds, which the run compares with its
own; the checksums of the LoRA it serves, where the run sends only the adapters (loaded through vLLM's own
`/v1/load_lora_adapter`, rlhf_cli/rank/engines/vllm/server_lora.py); its dtype; and the version of the weights it
holds, which a run checks before its first generation
(rlhf_cli/rank/engines/vllm/server.ServerTarget.check_version)."""

from __future__ import annotations

from typing import Any

from rlhf_cli.compat import vllm as vllm_compat

RELOAD_METHOD = "rlhf_reload_weights"
PATCH_METHOD = "rlhf_apply_patches"
CHECKSUM_METHOD = "rlhf_weight_checksums"
DTYPE_METHOD = "rlhf_weight_dtype"
COMMIT_METHOD = "rlhf_set_weight_version"
VERSION_METHOD = "rlhf_weight_version"
LORA_CHECKSUM_METHOD = "rlhf_lora_checksums"


class ReloadWithTiedLayers:
    """Mixed into vLLM's worker class by vLLM itself; `self` is the worker."""

    model_runner: Any
    rlhf_version: str | None = None  # the model's own weights, as loaded at start

    def rlhf_reload_weights(self, weights_path: str, version: str | None = None) -> list[str]:
        """Reload every weight from the safetensors files under `weights_path`, which are `version` (None: the run
        names them once the sync is whole, `rlhf_set_weight_version`); the layers re-processed after."""
        self.rlhf_version = None  # a reload that fails midway leaves no run's weights
        model = self.model_runner.get_model()
        vllm_compat.vllm_keep_unpacked_weights(model)  # from this reload on: what patches are written into
        self.model_runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        reprocessed = vllm_compat.vllm_reprocess_shared_layers(self.model_runner.get_model())
        self.rlhf_version = version
        return reprocessed

    def rlhf_apply_patches(self, patches_path: str) -> str | None:
        """Write the patches of the file at `patches_path` (rlhf_cli/rank/engines/vllm/patch_files.py) into the
        model; None, or why the model cannot take them (the run then syncs it densely)."""
        from rlhf_cli.rank.engines.vllm.patch_files import read_patch_file

        self.rlhf_version = None  # part of a sync: no run's whole weights until it is committed
        model = self.model_runner.get_model()
        dtype = self.model_runner.model_config.dtype
        patches = [(name, shape, dtype, values.to(dtype), indices)
                   for name, shape, values, indices in read_patch_file(patches_path)]
        try:
            vllm_compat.vllm_apply_patches(model, patches, vllm_compat.vllm_keep_unpacked_weights(model))
        except NotImplementedError as refused:  # vLLM's sparse-loader contract
            return str(refused)
        return None

    def rlhf_weight_checksums(self, groups: list[str] | None = None) -> dict[str, tuple[int, int]]:
        """`bit_sums` of every weight this worker holds (of `groups`, or all), by vLLM's names
        (rlhf_cli/rank/engines/delta.py)."""
        from rlhf_cli.rank.engines.vllm.target import vllm_checksums

        model = self.model_runner.get_model()
        return vllm_checksums(model, vllm_compat.vllm_keep_unpacked_weights(model),
                              self.model_runner.model_config.dtype, groups)

    def rlhf_lora_checksums(self) -> dict[str, tuple[int, int]]:
        """`bit_sums` of the matrices of the LoRA this worker serves (the newest loaded; the run loads one at a
        time), by vLLM's names; empty without one."""
        from rlhf_cli.compat import vllm_lora
        from rlhf_cli.rank.engines.delta import bit_sums

        ids = vllm_lora.vllm_lora_ids(self.model_runner)
        if not ids:
            return {}
        return {name: bit_sums(matrices)
                for name, matrices in vllm_lora.vllm_served_lora(self.model_runner, ids[-1]).items()}

    def rlhf_weight_dtype(self) -> str:
        """The dtype this worker holds its weights in, as torch names it without `torch.`."""
        return str(self.model_runner.model_config.dtype).removeprefix("torch.")

    def rlhf_set_weight_version(self, version: str) -> None:
        """The run's sync is whole: the weights are `version`."""
        self.rlhf_version = version

    def rlhf_weight_version(self) -> str | None:
        """The version of the weights last synced, None for the model's own (or a sync in progress)."""
        return self.rlhf_version
