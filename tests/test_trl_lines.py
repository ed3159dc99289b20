"""A `trl ALGO ...` command line pasted after `rlhf ALGO` resolves key for key as TRL's own parser resolves it
(TrlParser, transformers' HfArgumentParser): several words after a list flag, `--no_X`, `none`, a bare `no`,
`--config FILE`. TRL's side runs once, in a process of its own (TRL imports torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import RECIPES, REPO
from rlhf_cli.cli.train import trl_style_flags
from rlhf_cli.config.fields import catalogue
from rlhf_cli.config.resolve import RunRequest, resolve

# TRL's own parse of every line, once (the module-scoped `trl_parsed`): the file on one worker (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("trl-lines")

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


def test_pasted_accelerate_and_python_lines_keep_their_config_and_process_count(cli, nothing_launches,
                                                                                tmp_path) -> None:
    """Lines as public open-r1-style scripts write them, pasted after `rlhf grpo -r RECIPE`: accelerate's
    `--config_file`/`--config-file=` is the accelerate config, the script name and launcher words are taken off,
    and a `python SCRIPT` line runs one process (python starts one) unless it says otherwise."""
    config = tmp_path / "zero3.yaml"
    config.write_text((REPO / "accelerate_configs" / "deepspeed_zero3.yaml").read_text())
    unsaid = tmp_path / "no-count.yaml"  # the smoke recipe without its num_processes
    unsaid.write_text((RECIPES / "grpo" / "smoke.yaml").read_text().replace("num_processes: 2\n", "").replace(
        "../smoke", str(RECIPES / "smoke")))
    lines = {
        ("accelerate", "launch", "--config_file", config, "--num_processes=2", "src/open_r1/grpo.py",
         "--per_device_train_batch_size=2", "--num_train_epochs=1"): (2, "flag --config_file"),
        ("accelerate", "launch", "--main_process_port", "29501", "--num_processes=3", f"--config-file={config}",
         "src/tinyzero_trl/grpo.py"): (3, "flag --config-file"),
        ("python", "examples/scripts/grpo.py", "--learning_rate", "1e-6"): (1, None),
        ("python", "grpo.py", "--num_processes", "2"): (2, None),
    }
    for line, (processes, config_source) in lines.items():
        result = cli("grpo", "-r", unsaid, "-o", tmp_path / "out", *line, "--dry-run", "--json")
        assert result.exit_code == 0, result.output
        plan = json.loads(result.stdout)
        assert plan["accelerate"]["num_processes"] == processes, line
        if config_source:
            assert plan["sources"]["accelerate_config"] == config_source
        if processes == 1:  # the dry run says where the one process came from
            assert plan["sources"]["num_processes"] == "flag python examples/scripts/grpo.py"
    told = cli("grpo", "-r", "grpo/smoke", "-o", tmp_path / "out", "python", "grpo.py", "--dry-run", "--json")
    assert json.loads(told.stdout)["accelerate"]["num_processes"] == 2  # the recipe's num_processes: 2
    assert nothing_launches == []
