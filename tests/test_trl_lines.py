"""A `trl ALGO ...` command line pasted after `rlhf ALGO` resolves key for key as TRL's own parser resolves it
(TrlParser, transformers' HfArgumentParser): several words after a list flag, `--no_X`, `none`, a bare `no`,
`--config FILE`. TRL's side runs once, in a process of its own (TRL imports torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import RECIPES
from rlhf_cli.cli.train import trl_style_flags
from rlhf_cli.config.fields import catalogue
from rlhf_cli.config.resolve import RunRequest, resolve

LINES = {  # algorithm -> command lines as TRL's docs and public scripts write them
    "rloo": [
        ["--lora_target_modules", "q_proj", "v_proj", "--use_peft"],
        ["--report_to", "wandb", "tensorboard", "--learning_rate", "3e-6"],
        ["--no_gradient_checkpointing", "--save_strategy", "no", "--eval_steps", "none"],
        ["--no-gradient-checkpointing", "--bf16", "false", "--logging_steps", "5", "--seed", "7"],
        ["--use_vllm", "--vllm_mode", "colocate", "--num_generations", "4", "--beta=0.05"],
        ["--max_grad_norm", "0.5", "--lr_scheduler_type", "cosine", "--warmup_steps", "2"],
    ],
    "grpo": [
        ["--reward_funcs", "accuracy_reward", "think_format_reward", "--reward_weights", "1.0", "0.5"],
        ["--loss_type", "dr_grpo", "--scale_rewards", "none", "--mask_truncated_completions"],
        ["--report_to", "none", "--max_completion_length", "64", "--temperature", "0.7"],
    ],
}
TRL_SIDE = """
import json, sys
from trl.scripts import grpo, rloo
lines = json.loads(sys.argv[1])
out = {}
for algorithm, argvs in lines.items():
    parser = {"rloo": rloo, "grpo": grpo}[algorithm].make_parser()
    out[algorithm] = []
    for argv in argvs:
        # use_cpu: TrainingArguments refuses bf16 (TRL's default) without a GPU; it is no key compared
        parsed = parser.parse_args_and_config([*argv, "--use_cpu"], return_remaining_strings=True)
        values = {}
        for part in parsed[:-1]:
            values.update(vars(part))
        out[algorithm].append(values)
print(json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def trl_parsed() -> dict:
    done = subprocess.run([sys.executable, "-c", TRL_SIDE, json.dumps(LINES)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def named(argv: list[str]) -> set[str]:
    keys = {arg[2:].partition("=")[0].replace("-", "_") for arg in argv if arg.startswith("--")}
    return {key[3:] if key.startswith("no_") and key[3:] in LINE_KEYS else key for key in keys}


LINE_KEYS = {"gradient_checkpointing"}


@pytest.mark.parametrize(("algorithm", "index"), [(a, i) for a, lines in LINES.items() for i in range(len(lines))])
def test_a_trl_line_resolves_key_for_key_as_trl_parses_it(algorithm: str, index: int, trl_parsed: dict,
                                                          tmp_path) -> None:
    argv = LINES[algorithm][index]
    fields = catalogue(algorithm)
    trl_flags, rest = trl_style_flags(argv, lambda key: key in fields and "list" in fields[key].kinds)
    assert rest == []
    run = resolve(RunRequest(algorithm, str(RECIPES / algorithm / "smoke.yaml"),
                             {"output_dir": ("-o", str(tmp_path / "out"))}, trl_flags=trl_flags, planning=True),
                  cwd=tmp_path)
    theirs = trl_parsed[algorithm][index]
    for key in named(argv) - {"report_to"}:  # TrainingArguments drops integrations not installed, and `none`
        ours = run.value(key)
        assert json.loads(json.dumps(ours, default=str)) == theirs[key], (key, ours, theirs[key])
