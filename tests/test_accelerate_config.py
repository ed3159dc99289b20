"""The accelerate/DeepSpeed config a run launches with, for every gather and offload choice."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from helpers import write
from rlhf_cli.config.accelerate import AccelerateChoices, build_accelerate_config

DEVICES = ("none", "cpu", "nvme")


@pytest.mark.parametrize(("gather", "optimizer", "params"), itertools.product((True, False), DEVICES, DEVICES))
def test_every_gather_and_offload_combination(gather: bool, optimizer: str, params: str, tmp_path: Path) -> None:
    problems: list[str] = []
    config, notes = build_accelerate_config(AccelerateChoices(
        num_processes=4, offload_optimizer=optimizer, offload_params=params, nvme_path=str(tmp_path), gather=gather,
    ), problems)
    deepspeed = config["deepspeed_config"]
    assert problems == [] and notes == []
    assert config["distributed_type"] == "DEEPSPEED" and deepspeed["zero_stage"] == 3
    assert config["num_processes"] == 4
    assert deepspeed["offload_optimizer_device"] == optimizer
    assert deepspeed["offload_param_device"] == params
    assert deepspeed.get("offload_optimizer_nvme_path") == (str(tmp_path) if optimizer == "nvme" else None)
    assert deepspeed.get("offload_param_nvme_path") == (str(tmp_path) if params == "nvme" else None)
    assert config["use_cpu"] is False


def test_user_config_is_the_base_and_flags_override_it(tmp_path: Path) -> None:
    user = write(tmp_path / "mine.yaml", yaml.safe_dump({
        "distributed_type": "DEEPSPEED", "num_processes": 8, "mixed_precision": "bf16", "main_process_port": 1234,
        "deepspeed_config": {"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu"},
    }))
    problems: list[str] = []
    config, _ = build_accelerate_config(AccelerateChoices(user_config=str(user), offload_params="none"), problems)
    assert problems == []
    assert config["num_processes"] == 8 and config["main_process_port"] == 1234
    assert config["deepspeed_config"]["offload_optimizer_device"] == "cpu"  # not given: the file's value stands
    assert config["deepspeed_config"]["offload_param_device"] == "none"  # given: the flag wins


def test_no_gather_on_a_config_that_is_not_zero3_warns(tmp_path: Path) -> None:
    zero2 = write(tmp_path / "zero2.yaml", yaml.safe_dump({
        "distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2}}))
    problems: list[str] = []
    _, notes = build_accelerate_config(
        AccelerateChoices(user_config=str(zero2), gather=False, offload_params="cpu", zero3={"x": 1}), problems)
    assert problems == []
    assert notes == [f"warning: --no-gather has no effect: {zero2} is not a DeepSpeed ZeRO-3 config",
                     f"warning: --offload-params has no effect: {zero2} is not a DeepSpeed ZeRO-3 config",
                     f"warning: x have no effect: {zero2} is not a DeepSpeed ZeRO-3 config"]


def test_offload_without_deepspeed_is_an_error(tmp_path: Path) -> None:
    ddp = write(tmp_path / "ddp.yaml", yaml.safe_dump({"distributed_type": "MULTI_GPU", "num_processes": 2}))
    problems: list[str] = []
    build_accelerate_config(AccelerateChoices(user_config=str(ddp), offload_optimizer="cpu"), problems)
    assert problems == [f"{ddp} does not use DeepSpeed; offloading needs a DeepSpeed config"]


def test_cpu_machines_use_deepspeeds_cpu_path() -> None:
    config, _ = build_accelerate_config(AccelerateChoices(cpu_only=True), [])
    assert config["use_cpu"] is True and config["mixed_precision"] == "no"


def test_deepspeed_json_keys_in_accelerates_section_say_where_they_take_effect(tmp_path: Path) -> None:
    """accelerate ignores DeepSpeed's JSON keys in its `deepspeed_config` section: each is a warning naming where
    it does work: its accelerate key, the recipe (a ZeRO-3 key rlhf passes on, and the plan reads), or a
    deepspeed_config_file."""
    user = write(tmp_path / "mine.yaml", yaml.safe_dump({"distributed_type": "DEEPSPEED", "deepspeed_config": {
        "zero_stage": 3, "overlap_comm": False, "stage3_gather_16bit_weights_on_model_save": True,
        "sub_group_size": 1}}))
    problems: list[str] = []
    _, notes = build_accelerate_config(AccelerateChoices(user_config=str(user)), problems)
    assert problems == []
    said = {note.split("`")[1]: note.split("accelerate ignores here; ")[1] for note in notes}
    assert said == {"deepspeed_config.overlap_comm": "set it in the recipe (`overlap_comm:`, or --set "
                                                     "overlap_comm=...), which the plan reads too",
                    "deepspeed_config.stage3_gather_16bit_weights_on_model_save": "its accelerate key is "
                                                                                   "`zero3_save_16bit_model`",
                    "deepspeed_config.sub_group_size": "put it in a deepspeed_config_file"}
