"""The command line as a user meets it: help, dry runs, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import RECIPES, REPO, write
from rlhf_cli.algorithms import ALGORITHMS
from rlhf_cli.cli.flags import SWITCHES, TABLE

TRAIN_COMMANDS = tuple(entry.command for entry in ALGORITHMS.values())
pytestmark = pytest.mark.usefixtures("nothing_launches")  # no test here starts ranks
BUNDLED = sorted(RECIPES.glob("*/*.yaml"))


def test_help_of_every_command(cli) -> None:
    result = cli("--help")
    assert result.exit_code == 0
    for command in TRAIN_COMMANDS:
        assert command in result.output
        sub, planned = cli(command, "--help"), cli("plan", command, "--help")
        assert sub.exit_code == 0 and planned.exit_code == 0
        for flag in TABLE:  # both commands take every flag
            for option in flag.names:
                assert option in sub.output and option in planned.output, (command, option)
        assert "Example: rlhf" in sub.output


def test_version(cli) -> None:
    from rlhf_cli import __version__

    assert cli("--version").output.strip() == f"rlhf {__version__}"


def test_done_when_dry_run_json(cli, nothing_launches) -> None:
    result = cli("rloo", "-r", RECIPES / "rloo" / "smoke.yaml", "--no-gather", "--offload-optimizer", "cpu",
                 "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert {"trainer", "accelerate", "launch"} <= plan.keys()
    assert plan["trainer"]["ds3_gather_for_generation"] is False
    assert plan["accelerate"]["deepspeed_config"]["offload_optimizer_device"] == "cpu"
    assert plan["launch"]["argv"][2:4] == ["rlhf_cli.launch.supervisor", "--config_file"]
    assert plan["sources"]["ds3_gather_for_generation"] == "flag --no-gather"
    assert nothing_launches == []
    assert not Path(plan["trainer"]["output_dir"]).exists()  # a dry run writes nothing


def test_human_dry_run_shows_values_and_where_they_came_from(cli) -> None:
    result = cli("online-dpo", "-r", "online_dpo/smoke", "--max-steps", "9", "--set", "beta=0.2", "--dry-run")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any("max_steps" in line and "9" in line and "flag --max-steps" in line for line in lines)
    assert any("beta" in line and "0.2" in line and "--set" in line for line in lines)
    assert any("learning_rate" in line and "recipe" in line for line in lines)
    assert "rlhf_cli.launch.supervisor" in result.stdout


@pytest.mark.parametrize("recipe", BUNDLED, ids=[f"{p.parent.name}/{p.stem}" for p in BUNDLED])
def test_every_bundled_recipe_passes_dry_run(cli, recipe: Path) -> None:
    command = recipe.parent.name.replace("_", "-")
    if command not in TRAIN_COMMANDS:
        pytest.skip(f"no `rlhf {command}` command")
    result = cli(command, "-r", recipe, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["algorithm"] == recipe.parent.name


def test_a_run_writes_nothing_before_validation_passes(cli, nothing_launches, tmp_path: Path) -> None:
    result = cli("rloo", "-r", RECIPES / "rloo" / "smoke.yaml", "--set", "max_stepz=3", "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert not (tmp_path / "out").exists() and nothing_launches == []


BAD_INPUT = [
    (["-r", "missing.yaml"], "Error: missing.yaml: recipe not found; give a YAML file or a bundled recipe"),
    (["-r", "rloo/smoke", "--set", "learning_rat=1e-5"],
     "Error: --set learning_rat: unknown key `learning_rat`; did you mean `learning_rate`?"),
    (["-r", "rloo/smoke", "--set", "max_steps=lots"],
     "Error: --set max_steps: `max_steps`: expected an integer, got 'lots' (str)"),
    (["-r", "rloo/smoke", "--offload-params", "nvme"],
     "Error: offload_param_device is nvme but no --nvme-path DIR is given"),
    (["-r", "rloo/smoke", "--model", "./no-model"],
     "Error: --model: `model_name_or_path`: model directory ./no-model not found"),
    (["-r", "rloo/smoke", "--dataset", "./prompts.jsonl"],
     "Error: --dataset: `dataset_name`: dataset ./prompts.jsonl not found"),
    (["-r", "rloo/smoke", "--offload-optimizer", "disk"],
     "Error: --offload-optimizer: `offload_optimizer`: expected one of none, cpu, nvme, got 'disk'"),
    (["-r", "rloo/smoke", "--json"], "--json goes with --dry-run"),
    (["-r", "rloo/smoke", "--stall-timeout", "2"],
     "Error: --stall-timeout: `stall_timeout`: must be at least 5 and at most 604800, got 2.0: heartbeats come "
     "every 2 s"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_launches_nothing(cli, nothing_launches, args, message) -> None:
    result = cli("rloo", *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    assert nothing_launches == []


SINGLE_VALUED = [flag for flag in TABLE if not flag.repeatable]


@pytest.mark.parametrize("flag", SINGLE_VALUED, ids=[flag.names[0] for flag in SINGLE_VALUED])
def test_every_single_valued_flag_given_twice_is_refused(cli, nothing_launches, flag) -> None:
    """The class, from the flag table: click keeps the last of an option given twice; we refuse it instead."""
    given = [flag.names[-1]] if flag.kind is bool else [flag.names[-1], "7"]
    recipe = [] if flag.parameter == "recipe" else ["-r", "rloo/smoke"]
    result = cli("rloo", *recipe, *given, *given)
    assert result.exit_code == 2, result.output
    assert f"Error: {' / '.join(flag.names)} is given 2 times" in result.output
    assert "Traceback" not in result.output and nothing_launches == []


def test_set_stays_repeatable(cli, tmp_path: Path) -> None:
    result = cli("rloo", "-r", "rloo/smoke", "-s", "seed=3", "--set", "max_steps=2", "--dry-run", "--json",
                 "-o", tmp_path / "run")
    assert result.exit_code == 0, result.output
    trainer = json.loads(result.stdout[result.stdout.index("{"):])["trainer"]
    assert (trainer["seed"], trainer["max_steps"]) == (3, 2)


def test_the_collective_timeout_follows_the_stall_timeout_and_a_dry_run_says_so(cli) -> None:
    result = cli("rloo", "-r", "rloo/smoke", "--stall-timeout", "30", "--dry-run")
    assert result.exit_code == 0, result.output
    assert any("ddp_timeout" in line and "150" in line for line in result.stdout.splitlines())
    plan = json.loads(cli("rloo", "-r", "rloo/smoke", "--stall-timeout", "30", "--dry-run", "--json").stdout)
    assert plan["sources"]["ddp_timeout"] == "rlhf: 5 x stall_timeout"
    default = json.loads(cli("rloo", "-r", "rloo/smoke", "--dry-run", "--json").stdout)
    assert default["trainer"]["ddp_timeout"] == 600 and default["plan"]["checkpoint_bytes"] > 0
    own = cli("rloo", "-r", "rloo/smoke", "--set", "ddp_timeout=60", "--dry-run", "--json")
    assert json.loads(own.stdout)["trainer"]["ddp_timeout"] == 60  # the recipe's own wins, with a warning
    assert any(note.startswith("warning: ddp_timeout 60 is not above stall_timeout 120")
               for note in json.loads(own.stdout)["notes"])


def test_bad_yaml_names_file_and_line(cli, tmp_path: Path) -> None:
    recipe = write(tmp_path / "broken.yaml", "model_name_or_path: x\nlearning_rate: [1e-5\n")
    result = cli("rloo", "-r", recipe)
    assert result.exit_code == 2
    assert f"Error: {recipe}:3: not valid YAML" in result.output


def test_no_gather_with_a_non_zero3_config_warns(cli, tmp_path: Path) -> None:
    config = write(tmp_path / "ddp.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\n")
    result = cli("rloo", "-r", "rloo/smoke", "--no-gather", "--accelerate-config", config, "--dry-run")
    assert result.exit_code == 0
    assert f"warning: --no-gather has no effect: {config} is not a DeepSpeed ZeRO-3 config" in result.stderr


def test_a_real_invocation_launches_with_the_notes_printed(cli, nothing_launches, tmp_path: Path) -> None:
    recipe = write(tmp_path / "old.yaml", f"sft_model_path: {RECIPES}/smoke/policy\n"
                                          f"reward_model_path: {RECIPES}/smoke/reward\n"
                                          f"dataset_name: {RECIPES}/smoke/prompts.jsonl\nrloo_k: 4\n")
    result = cli("rloo", "-r", recipe, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "`rloo_k` is the old name of `num_generations`" in result.stderr
    assert len(nothing_launches) == 1 and nothing_launches[0].value("num_generations") == 4


@pytest.mark.parametrize(("args", "code", "shown"), [(["rloo", "-r", "rloo/smoke", "--dry-run"], 0, "caf\\xe9"),
                                                     (["rloo", "-r", "rloo/smoke", "--dry-run", "--json"], 0,
                                                      "caf\\u00e9"),
                                                     (["plan", "rloo", "-r", "rloo/smoke"], 0, ""),
                                                     (["rloo", "-r", "{dir}/r.yaml"], 2, "caf\\xe9")])
def test_a_non_ascii_path_on_an_ascii_pipe_is_printed_escaped(args: list[str], code: int, shown: str,
                                                              tmp_path: Path) -> None:
    """PYTHONIOENCODING=ascii and output to a pipe: the path is written escaped (caf\\xe9), never an internal error."""
    where = tmp_path / "café"
    args = [arg.replace("{dir}", str(where)) for arg in args]
    done = subprocess.run([sys.executable, "-m", "rlhf_cli", *args, "-o", str(where)], capture_output=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONIOENCODING": "ascii", "PYTHONPATH": str(REPO)})
    output = (done.stdout + done.stderr).decode("ascii")  # nothing but ASCII came out
    assert done.returncode == code, output[-2000:]
    assert shown in output and "internal error" not in output and "Traceback" not in output


HEAVY = ("torch", "transformers", "trl", "deepspeed", "datasets", "accelerate")
# What a `--help` must not import either: pydantic (a fifth of its start-up), which Typer uses to check values
HEAVY_FOR_HELP = (*HEAVY, "pydantic")


@pytest.mark.parametrize("args", [["--help"], ["rloo", "--help"], ["plan", "grpo", "--help"],
                                  ["vllm-serve", "ppo", "--help"], ["doctor", "--help"],
                                  ["vllm-serve", "grpo", "-r", "grpo/smoke", "--lora", "--dry-run"],
                                  ["rloo", "-r", "rloo/smoke", "--no-gather", "--dry-run", "--json"],
                                  ["ppo", "-r", "ppo/smoke", "--no-gather", "--dry-run"],
                                  ["recipes"], ["init", "online-dpo"],
                                  ["plan", "ppo", "-r", "ppo/smoke", "--gather", "auto"]])
def test_help_and_dry_run_import_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    heavy = HEAVY_FOR_HELP if "--help" in args else HEAVY
    probe = ("import sys\nfrom rlhf_cli.cli.app import app\n"
             "try:\n    app(%r)\nexcept SystemExit:\n    pass\n"
             "print('HEAVY', [m for m in %r if m in sys.modules])" % (args, heavy))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert "HEAVY []" in done.stdout, done.stdout[-500:] + done.stderr[-2000:]


@pytest.mark.parametrize(("command", "words"), [("recipes", "--json"), ("init", "rloo --out FILE"),
                                               ("doctor", "--json"), ("report", "RUN_DIR --out PNG")])
def test_every_other_command_has_help_with_an_example(cli, command: str, words: str) -> None:
    assert command in cli("--help").output
    result = cli(command, "--help")
    assert result.exit_code == 0
    assert "Example: rlhf" in result.output
    assert all(word.split()[0] in result.output for word in words.split() if word.startswith("--"))


# Typer's own options (help and shell completion) are not ours to declare.
TYPERS_OWN = ("--help", "--install-completion", "--show-completion")


@pytest.mark.parametrize("args", [["--help"], ["rloo", "--help"], ["plan", "ppo", "--help"], ["recipes", "--help"],
                                  ["init", "--help"], ["doctor", "--help"]])
def test_boolean_flags_show_no_value_in_help(cli, args: list[str]) -> None:
    output = cli(*args).output
    flags = [line for line in output.splitlines() if "--" in line and not any(own in line for own in TYPERS_OWN)]
    assert any(word in output for word in ("--dry-run", "--json", "--force", "--version"))
    assert flags and not [line for line in flags if "<bool>" in line]


def test_bash_completion_completes_commands_and_choices(tmp_path: Path) -> None:
    """What the script from `rlhf --show-completion bash` asks the program, answered without heavy imports."""
    probe = ("import sys\nfrom rlhf_cli.cli.app import app\n"
             "try:\n    app(prog_name='rlhf')\nexcept SystemExit:\n    pass\n"
             "print('HEAVY', [m for m in %r if m in sys.modules])" % (HEAVY,))
    answers = {}
    for line, expected in (("rlhf re", "recipes report"), ("rlhf init ", " ".join(TRAIN_COMMANDS)),
                           ("rlhf rloo --offload-optimizer ", "none cpu nvme")):
        env = {**os.environ, "_RLHF_COMPLETE": "complete_bash", "COMP_WORDS": line,
               "COMP_CWORD": str(len(line.split(" ")) - 1)}
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env)
        answers[line] = done.stdout.split()
        assert answers[line] == [*expected.split(), "HEAVY", "[]"], done.stderr[-2000:]
    # From bash, as a user would: Typer names the shell by looking for one among the program's parent processes
    # (`; exit` keeps bash from replacing itself with the program).
    show = f"{shlex.quote(sys.executable)} -c \"from rlhf_cli.cli.app import app; app(prog_name='rlhf')\" " \
           "--show-completion; exit $?"
    script = subprocess.run(["bash", "-c", show], capture_output=True, text=True, cwd=tmp_path)
    assert "_RLHF_COMPLETE=complete_bash" in script.stdout and "complete -o default -F _rlhf_completion rlhf" in \
        script.stdout


def test_console_script_is_installed() -> None:
    done = subprocess.run(["rlhf", "--version"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and done.stdout.startswith("rlhf ")


def test_each_on_off_pair_is_one_on_and_one_off_flag() -> None:
    """`--X` / `--no-X` for gather, vLLM and LoRA: one row each way in the flag table, for one recipe key."""
    assert {key: (on.names[0], off.names[0]) for key, (on, off) in SWITCHES.items()} == {
        "ds3_gather_for_generation": ("--gather", "--no-gather"), "use_vllm": ("--vllm", "--no-vllm"),
        "use_peft": ("--lora", "--no-lora")}
    assert sum(flag.switch is not None for flag in TABLE) == 2 * len(SWITCHES)


@pytest.mark.parametrize("on", ["--gather", "--vllm colocate", "--lora"])
def test_an_on_off_pair_given_both_ways_is_one_contradiction(cli, nothing_launches, on: str) -> None:
    flag = on.split()[0]
    result = cli("rloo", "-r", "rloo/smoke", *on.split(), f"--no-{flag[2:]}", "--dry-run")
    assert result.exit_code == 2
    assert f"{flag} and --no-{flag[2:]} contradict each other; keep one" in result.output
