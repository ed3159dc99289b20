"""The seed's own experiment, `rlhf ppo -r ppo/pythia-12b-descriptiveness`, end to end on CPU.

Its models stand in for pythia-12b and pythia-70m: GPT-NeoX with pythia's tokenizer conventions (no pad
token, <|endoftext|> as BOS and EOS, spare embedding rows), the reward model a plain causal LM. Only what a
CPU cannot hold changes: 2 processes, batch sizes and episodes, the dataset (the hub is out of reach). The
recipe's bf16 stands: rlhf runs it on the CPU (use_cpu), where torch has bf16 too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from helpers import RECIPES, launch_rlhf

CPU_SIZED = ("--num-processes", "2", "--no-gather", "--set", "gradient_accumulation_steps=2", "--set",
             "total_episodes=8", "--set", "local_rollout_forward_batch_size=2", "--set", "response_length=16")


def test_seed_recipe_runs_on_pythia_stand_ins(family_models: dict[str, Path], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pythia, out = family_models["pythia"], tmp_path / "run"
    done = launch_rlhf("ppo", out, "--model", str(pythia), "--reward-model", str(pythia),
                       "--dataset", str(RECIPES / "smoke" / "prompts.jsonl"), *CPU_SIZED,
                       recipe="ppo/pythia-12b-descriptiveness")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    notes = [line for line in done.stderr.splitlines() if line.startswith("rlhf: ")]
    assert any("has no pad token of its own: added" in line for line in notes), notes
    assert sum("GPTNeoXForCausalLM: loaded as a sequence classifier" in line for line in notes) == 2, notes

    recipe = (out / "recipe.yaml").read_text()
    assert "offload_optimizer: cpu" in recipe and "missing_eos_penalty: 1.0" in recipe  # the seed's own choices
    assert "bf16: true" in recipe and "use_cpu: true" in recipe
    state = json.loads((out / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "objective/scores" in entry]
    assert [entry["episode"] for entry in steps] == [4, 8]
    assert all(math.isfinite(value) for entry in steps for value in entry.values() if isinstance(value, float))

    tokenizer, policy = AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)
    assert tokenizer.pad_token_id not in (None, tokenizer.eos_token_id)
    assert policy.config.vocab_size == AutoModelForCausalLM.from_pretrained(pythia).config.vocab_size  # a spare row
