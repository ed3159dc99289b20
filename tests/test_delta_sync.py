"""The shard-local delta sync (rlhf_cli/rank/engines/delta.py) into a generator that holds checkpoint tensors as
they are sent: dense first, then only what changed, bit for bit what a full sync sends; a lost patch named, a
partition that changed too much sent whole, a refused patch turned into dense syncs. Single process: the rank's
partition is the whole tensor (the ZeRO-3 partition arithmetic is the launched test's)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from rlhf_cli.generation.sync_buckets import PER_UNIT
from rlhf_cli.rank.engines.delta import INDEX_BYTES, OFF_REASON, SyncMismatch, bit_sums, group_of
from rlhf_cli.rank.engines.sync import sync_weights
from rlhf_cli.rank.engines.vllm.server import ServerTarget
from rlhf_cli.rank.engines.vllm.target import ColocatedVLLM
from rlhf_cli.rank.engines.weights import Patch, SyncLimit


class Holder:
    """A generator holding each checkpoint tensor flat, in bf16; q/k/v fused into one tensor, as vLLM does."""

    dense_reason = None
    dtype = torch.bfloat16
    instead = "with another generator"

    def __init__(self) -> None:
        self.held: dict[str, torch.Tensor] = {}
        self.lose: str | None = None  # a checkpoint name whose patches never arrive
        self.refuse = False
        self.patches: list[Patch] = []
        self.checked: list[set[str] | None] = []  # the groups of each checksums call

    def load(self, weights: Any) -> None:
        for name, tensor in weights:
            self.held[name] = tensor.detach().to(self.dtype).flatten().clone()

    def patch(self, patches: list[Patch]) -> None:
        if self.refuse:
            raise NotImplementedError("Sparse checkpoint patches require a same-shaped floating-point final copy")
        for patch in patches:
            self.patches.append(patch)
            if patch.name != self.lose:
                self.held[patch.name][patch.indices.long()] = patch.values

    def checksums(self, groups: set[str] | None = None) -> dict[str, tuple[int, int]]:
        self.checked.append(groups)
        fused = [name for name in self.held if name.endswith(("q_proj.weight", "k_proj.weight"))]
        found = {name: bit_sums(tensor) for name, tensor in self.held.items() if name not in fused}
        for name in fused:  # q and k held as one tensor of the same module
            together = torch.cat([self.held[name], self.held[name.replace("q_proj", "k_proj")]]) \
                if "q_proj" in name else None
            if together is not None:
                found[name.replace("q_proj", "qk_proj")] = bit_sums(together)
        return {name: sums for name, sums in found.items() if groups is None or group_of(name) in groups}

    def reset(self) -> None:
        pass

    def after_sync(self, model: Any, woke: bool) -> dict[str, Any]:
        return {}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.o_proj = (torch.nn.Linear(16, 16, bias=False) for _ in range(3))


class Policy(torch.nn.Module):
    """Two blocks and a norm, in bf16 as a bf16 run trains."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.norm = torch.nn.LayerNorm(16)
        self.to(torch.bfloat16)


def _step(model: torch.nn.Module, share: float) -> None:
    """Move about `share` of every weight's elements by more than bf16's resolution."""
    with torch.no_grad():
        for param in model.parameters():
            picked = torch.rand(param.shape) < share
            param[picked] = param[picked] * 1.5 + 0.01


def test_after_a_dense_first_sync_only_what_changed_is_sent_and_the_generator_holds_every_bit() -> None:
    model, holder = Policy(), Holder()
    first = sync_weights(model, holder, SyncLimit(PER_UNIT))
    assert first["mode"] == "dense" and first["dense_reason"].startswith("first sync")
    assert first["bytes_sent"] == first["dense_bytes"] == sum(p.numel() * 2 for p in model.parameters())
    _step(model, 0.02)
    changed = sum(int((p.detach() != holder.held[n].view(p.shape)).sum()) for n, p in model.named_parameters())
    second = sync_weights(model, holder, SyncLimit(PER_UNIT))
    assert second["mode"] == "sparse" and second["changed_share"] == changed / second["dense_bytes"] * 2
    assert second["bytes_sent"] == changed * (2 + INDEX_BYTES) < second["dense_bytes"] / 5
    for name, param in model.named_parameters():
        assert torch.equal(holder.held[name], param.detach().flatten()), name  # what a full sync sends
    assert second["groups_verified"] == 3  # layers.0, layers.1, the top (the norm)
    assert holder.checked[-3:] == [{"layers.0"}, {"layers.1"}, {""}]  # each as soon as its bucket is applied
    unchanged = sync_weights(model, holder, SyncLimit(PER_UNIT))
    assert unchanged["bytes_sent"] == 0 and unchanged["changed_share"] == 0


def test_a_lost_patch_stops_the_sync_naming_the_parameter() -> None:
    model, holder = Policy(), Holder()
    sync_weights(model, holder, SyncLimit(PER_UNIT))
    _step(model, 0.05)
    holder.lose = "layers.1.o_proj.weight"
    with pytest.raises(SyncMismatch, match=r"^after weight sync 2, the generator's layers\.1\.o_proj\.weight differs"):
        sync_weights(model, holder, SyncLimit(PER_UNIT))
    holder.lose = "layers.0.k_proj.weight"  # held fused with q: the line names both it could be
    _step(model, 0.05)
    with pytest.raises(SyncMismatch, match=r"one of layers\.0\.k_proj\.weight, layers\.0\.q_proj\.weight differs"):
        sync_weights(model, holder, SyncLimit(PER_UNIT))


@pytest.mark.parametrize(("target", "advised", "not_advised"), [
    (ColocatedVLLM, "or with --vllm server or without --vllm,", "--vllm colocate"),
    (ServerTarget, "or with --vllm colocate or without --vllm,", "--vllm server"),
], ids=["colocated", "server"])
def test_a_mismatch_advises_dense_syncs_or_another_generator_than_the_one_that_failed(
        target: type, advised: str, not_advised: str) -> None:
    model, holder = Policy(), Holder()
    holder.instead = target.instead
    sync_weights(model, holder, SyncLimit(PER_UNIT))
    _step(model, 0.05)
    holder.lose = "layers.1.o_proj.weight"
    with pytest.raises(SyncMismatch) as failed:
        sync_weights(model, holder, SyncLimit(PER_UNIT))
    message = str(failed.value)
    assert "Run with --set weight_sync_delta=false (dense syncs), " + advised in message, message
    assert not_advised not in message and "\n" not in message


def test_a_partition_that_changed_too_much_goes_whole_and_a_refused_patch_turns_dense() -> None:
    model, holder = Policy(), Holder()
    sync_weights(model, holder, SyncLimit(PER_UNIT))
    with torch.no_grad():
        model.norm.weight.add_(1.0)  # every element of one parameter changes
    record = sync_weights(model, holder, SyncLimit(PER_UNIT))
    whole = [patch for patch in holder.patches if patch.name == "norm.weight"]
    assert record["mode"] == "sparse" and len(whole) == 1 and whole[0].values.numel() == 16
    assert record["bytes_sent"] == 16 * 2  # the slice's values alone: cheaper than 16 indices and values
    _step(model, 0.02)
    holder.refuse = True
    refused = sync_weights(model, holder, SyncLimit(PER_UNIT))
    assert refused["mode"] == "dense" and "cannot take patches" in refused["dense_reason"]
    assert all(torch.equal(holder.held[n], p.detach().flatten()) for n, p in model.named_parameters())
    assert sync_weights(model, holder, SyncLimit(PER_UNIT))["mode"] == "dense"  # from then on


def test_a_float32_generator_is_synced_whole_and_says_why() -> None:
    model, holder = Policy().float(), Holder()
    holder.dtype = torch.float32
    sync_weights(model, holder, SyncLimit(PER_UNIT))
    _step(model, 0.01)
    record = sync_weights(model, holder, SyncLimit(PER_UNIT))
    assert record["mode"] == "dense" and "float32" in record["dense_reason"]


def test_with_the_delta_turned_off_every_sync_is_dense_checked_and_says_why() -> None:
    """`weight_sync_delta: false`: a bf16 generator gets the whole policy at every sync, still checked bit for bit;
    another policy's syncs in the same process keep their deltas (the switch is the sync's, not the process's)."""
    model, holder = Policy(), Holder()
    other, beside = Policy(), Holder()
    sync_weights(model, holder, SyncLimit(PER_UNIT), delta=False)
    sync_weights(other, beside, SyncLimit(PER_UNIT))
    _step(model, 0.02)
    _step(other, 0.02)
    record = sync_weights(model, holder, SyncLimit(PER_UNIT), delta=False)
    assert record["mode"] == "dense" and record["dense_reason"] == OFF_REASON and not holder.patches
    assert record["bytes_sent"] == record["dense_bytes"] and record["groups_verified"] == 3
    assert all(torch.equal(holder.held[n], p.detach().flatten()) for n, p in model.named_parameters())
    assert sync_weights(other, beside, SyncLimit(PER_UNIT))["mode"] == "sparse"
    turned_on = sync_weights(model, holder, SyncLimit(PER_UNIT))  # no snapshot was kept: dense once more
    assert turned_on["mode"] == "dense" and turned_on["dense_reason"].startswith("first sync")
    _step(model, 0.02)
    assert sync_weights(model, holder, SyncLimit(PER_UNIT))["mode"] == "sparse"


def test_checksums_do_not_depend_on_layout_and_groups_are_modules() -> None:
    tensor = torch.randn(4, 6).to(torch.bfloat16)
    assert bit_sums(tensor) == bit_sums(tensor.t().contiguous()) == bit_sums(tensor.flatten().flip(0))
    large = torch.randn(3 << 23).to(torch.bfloat16)  # over one chunk
    assert bit_sums(large) == bit_sums(large.flip(0))
    bumped = tensor.clone()
    bumped[0, 0] = bumped[0, 0] * 2
    assert bit_sums(bumped) != bit_sums(tensor)
    assert group_of("model.layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn"
    assert group_of("lm_head.weight") == ""


def test_a_target_that_takes_no_patches_gets_every_weight_at_every_sync() -> None:
    model, holder = Policy(), Holder()
    holder.dense_reason, holder.dtype = "the vLLM server reloads whole weight files", None
    for _ in range(2):
        record = sync_weights(model, holder, SyncLimit(PER_UNIT))
        assert record["mode"] == "dense" and record["dense_reason"] == holder.dense_reason
        assert record["bytes_sent"] == sum(p.numel() * 2 for p in model.parameters())
        _step(model, 0.02)


def _adapted(dora: bool = False) -> Any:
    """The policy with LoRA adapters (r 2) on q and o, as PEFT builds them (adapters upcast to float32)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(Policy(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "o_proj"],
                                               use_dora=dora))


def _train_adapters(model: Any) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.add_(torch.randn(param.shape) * 0.3)


def test_with_lora_a_delta_sends_only_the_adapted_modules_and_equals_a_full_merged_sync() -> None:
    model, holder = _adapted(), Holder()
    first = sync_weights(model, holder, SyncLimit(PER_UNIT))
    assert first["mode"] == "dense" and first["merged_lora_layers"] == 4
    _train_adapters(model)
    before = {name: tensor.clone() for name, tensor in holder.held.items()}
    second = sync_weights(model, holder, SyncLimit(PER_UNIT))
    adapted = {f"layers.{layer}.{module}.weight" for layer in (0, 1) for module in ("q_proj", "o_proj")}
    assert second["mode"] == "sparse" and second["scope"].startswith("LoRA: only the adapted modules")
    assert {patch.name for patch in holder.patches} == set(second["patched"]) == adapted
    changed = sum(int((before[name] != holder.held[name]).sum()) for name in adapted)
    assert second["changed_share"] == changed / (4 * 16 * 16)  # of the adapted weights' elements alone
    assert 0 < changed * 2 <= second["bytes_sent"] <= 4 * 16 * 16 * 2 < second["dense_bytes"]  # the adapted alone
    full = Holder()  # a new generator: everything, merged, as the first sync (from a copy: outside ZeRO-3 a merge
    sync_weights(copy.deepcopy(model), full, SyncLimit(PER_UNIT))  # and unmerge round the base's bf16 in place)
    assert holder.checksums() == full.checksums()
    assert all(torch.equal(holder.held[name], full.held[name]) for name in full.held)
    assert sync_weights(model, holder, SyncLimit(PER_UNIT))["bytes_sent"] == 0  # the frozen base: never again
    holder.lose = "layers.0.o_proj.weight"
    _train_adapters(model)
    with pytest.raises(SyncMismatch, match=r"generator's layers\.0\.o_proj\.weight differs"):
        sync_weights(model, holder, SyncLimit(PER_UNIT))


def test_a_lora_variant_that_merges_otherwise_is_synced_whole_and_says_why() -> None:
    model, holder = _adapted(dora=True), Holder()
    sync_weights(model, holder, SyncLimit(PER_UNIT))
    _train_adapters(model)
    record = sync_weights(model, holder, SyncLimit(PER_UNIT))
    assert record["mode"] == "dense" and "DoRA" in record["dense_reason"]


class ServedLora:
    """A generator's own LoRA (rlhf_cli/rank/engines/weights.AdapterServer): the matrices as loaded, by
    `<module>.lora_A|lora_B`; `lose` names one that is loaded as zeros."""

    max_rank = 8

    def __init__(self) -> None:
        self.packed: Any = None
        self.lose: str | None = None
        self.sliced = False  # tensor parallel: it cannot show the matrices whole

    def load(self, packed: Any) -> None:
        self.packed = packed

    def checksums(self) -> dict[str, tuple[int, int]] | None:
        if self.sliced:
            return None
        held = {name.removeprefix("base_model.model.").removesuffix(".weight"): tensor
                for name, tensor in self.packed.tensors.items()}
        return {name: bit_sums(torch.zeros_like(tensor) if name == self.lose else tensor)
                for name, tensor in held.items()}


def _serving_lora() -> Holder:
    holder = Holder()
    holder.adapters = ServedLora()
    return holder


def test_a_generator_serving_lora_gets_the_base_once_then_the_adapters_alone_scaled_and_checked() -> None:
    model, holder = _adapted(), _serving_lora()
    base = {name: param.detach().clone() for name, param in model.named_parameters() if ".lora_" not in name}
    _train_adapters(model)
    first = sync_weights(model, holder, SyncLimit(PER_UNIT))
    assert first["mode"] == "dense" and first["dense_reason"].startswith("first sync")
    assert first["merged_lora_layers"] == 0 and first["scope"].startswith("LoRA: only the adapter matrices")
    for name, value in base.items():  # the base as it is, not merged
        short = name.removeprefix("base_model.model.").replace(".base_layer", "")
        assert torch.equal(holder.held[short], value.flatten()), name
    adapter_bytes = 4 * 2 * (16 + 16) * 2  # 4 modules, A (2 x 16) and B (16 x 2), bf16
    assert first["bytes_sent"] == first["dense_bytes"] + adapter_bytes and first["adapter_bytes"] == adapter_bytes
    _train_adapters(model)
    before = {name: tensor.clone() for name, tensor in holder.held.items()}
    second = sync_weights(model, holder, SyncLimit(PER_UNIT))
    assert second["mode"] == "adapter" and second["bytes_sent"] == adapter_bytes == second["adapter_bytes"]
    assert second["adapter_groups_verified"] == 2 and not holder.patches  # each layer's; the base untouched
    assert all(torch.equal(before[name], holder.held[name]) for name in before)
    packed = holder.adapters.packed
    assert packed.config == {"peft_type": "LORA", "r": 2, "lora_alpha": 2, "target_modules": ["o_proj", "q_proj"],
                             "bias": "none", "use_rslora": False, "use_dora": False}  # B carries the scaling
    layer = model.base_model.model.layers[1].o_proj
    assert torch.equal(packed.tensors["base_model.model.layers.1.o_proj.lora_A.weight"],
                       layer.lora_A["default"].weight.detach().to(torch.bfloat16))
    assert torch.equal(packed.tensors["base_model.model.layers.1.o_proj.lora_B.weight"],
                       (layer.lora_B["default"].weight.detach() * 2.0).to(torch.bfloat16))  # alpha 4 / r 2
    holder.adapters.lose = "layers.0.q_proj.lora_B"
    with pytest.raises(SyncMismatch, match=r"after weight sync 3, the generator's LoRA layers\.0\.q_proj\.lora_B "
                                           r"differs"):
        sync_weights(model, holder, SyncLimit(PER_UNIT))
    holder.adapters.sliced = True  # nothing it shows, nothing checked
    assert sync_weights(model, holder, SyncLimit(PER_UNIT))["adapter_groups_verified"] == 0


@pytest.mark.parametrize(("dora", "save", "delta", "reason"), [
    (True, None, True, "DoRA"), (False, ["norm"], True, "trains outside the adapters"),
    (False, None, False, "weight_sync_delta is false"),
], ids=["dora", "modules-to-save", "delta-off"])
def test_adapters_a_generator_cannot_serve_as_they_are_go_merged_and_say_why(
        dora: bool, save: list[str] | None, delta: bool, reason: str) -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(Policy(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "o_proj"],
                                                use_dora=dora, modules_to_save=save))
    holder = _serving_lora()
    record = sync_weights(model, holder, SyncLimit(PER_UNIT), delta=delta)
    assert record["mode"] == "dense" and record["merged_lora_layers"] == 4 and holder.adapters.packed is None
    assert reason in record["adapters_merged_reason"], record
