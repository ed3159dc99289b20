"""A recipe and an accelerate config as they are read: a file far larger than any config is refused before it is
read, and what TRL runs without a word (a key written twice with one value, a DeepSpeed key accelerate ignores) is
a warning, not a refusal."""

from __future__ import annotations

import time
from pathlib import Path

from helpers import REPO


def _lines(result) -> list[str]:
    return [" ".join(line.split()) for line in result.output.splitlines() if line.strip()]


def test_a_huge_recipe_is_refused_at_once_with_the_size_limit(cli, nothing_launches, tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as handle:
        handle.truncate(200 * 2**20)  # 200 MB, without writing them
    started = time.monotonic()
    result = cli("rloo", "-r", huge, "-o", tmp_path / "out", "--dry-run")
    assert time.monotonic() - started < 30
    assert result.exit_code == 2 and _lines(result) == [f"Error: {huge}: larger than 10 MiB, which no recipe is (a "
                                                        "few KB); is it the right file?"]
    assert nothing_launches == []


def test_a_key_repeated_with_its_value_and_a_deepspeed_key_accelerate_ignores_are_warnings(cli, nothing_launches,
                                                                                           tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    smoke = (REPO / "recipes" / "rloo" / "smoke.yaml").read_text().replace("../smoke", str(REPO / "recipes" / "smoke"))
    recipe.write_text(smoke + "warmup_steps: 1\nwarmup_steps: 1\n")
    config = tmp_path / "accelerate.yaml"
    config.write_text((REPO / "accelerate_configs" / "deepspeed_zero3.yaml").read_text().replace(
        "  zero_stage: 3\n", "  zero_stage: 3\n  stage3_gather_16bit_weights_on_model_save: true\n"))
    result = cli("rloo", "-r", recipe, "--accelerate-config", config, "-o", tmp_path / "out", "--dry-run")
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "`warmup_steps` is given again with the same value" in said
    assert "`deepspeed_config.stage3_gather_16bit_weights_on_model_save`: DeepSpeed's JSON key, which accelerate " \
           "ignores here; its accelerate key is `zero3_save_16bit_model`" in said
    recipe.write_text(recipe.read_text() + "warmup_steps: 2\n")  # another value: YAML would keep the last silently
    result = cli("rloo", "-r", recipe, "-o", tmp_path / "out", "--dry-run")
    assert result.exit_code == 2 and "`warmup_steps` is given again (first on line" in " ".join(result.output.split())
