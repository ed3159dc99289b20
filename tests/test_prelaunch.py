"""The pre-launch check: the trainer's config built and the reward functions imported once, in a process of their
own, before any rank starts; what they refuse is reported like every other mistake. Seconds each (TRL's import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import RECIPES, REPO, launch_rlhf, write
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.launch.prelaunch import check_before_launch, check_key

CHECK = """
import json, sys
from pathlib import Path
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.launch.prelaunch import PendingCheck

command, recipe, *sets = sys.argv[1:]
run = resolve(RunRequest(command, recipe, sets=tuple(sets)), cwd=Path.cwd(), cuda=False)
checking = PendingCheck(run)
try:
    checking.wait()
    problems = []
except ConfigError as error:
    problems = error.problems
heavy = [name for name in ("torch", "transformers", "trl", "deepspeed") if name in sys.modules]
print(json.dumps({"problems": problems, "heavy_in_launcher": heavy, "remembered": checking.remembered}))
"""


def run_check(tmp_path: Path, *sets: str, recipe: str = "rloo/smoke", command: str | None = None) -> dict:
    """The check as the launcher runs it, from a fresh process: its problems, and what the launcher imported."""
    command = command or recipe.partition("/")[0]
    done = subprocess.run([sys.executable, "-c", CHECK, command, recipe, *sets], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_what_trl_and_the_reward_functions_refuse_is_found_before_any_rank(tmp_path: Path) -> None:
    write(tmp_path / "raises.py", "raise RuntimeError('no GPU quota')\n")
    write(tmp_path / "narrow.py", "def score(completions):\n    return [0.0 for _ in completions]\n")
    write(tmp_path / "chatty.py", "print('hello from the user module')\n"
                                  "def score(prompts, completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    found = run_check(tmp_path, "reward_funcs=[raises.py:score, narrow.py:score, chatty.py:score]",
                      "auto_find_batch_size=true")
    assert found["heavy_in_launcher"] == []  # TRL and torch stayed in the check's own process
    assert not (Path(os.environ["RLHF_CACHE"]) / "passed-checks").exists()  # a refusal is never remembered
    problems = found["problems"]
    assert len(problems) == 3, problems
    assert problems[0] == f"`reward_funcs`: {tmp_path}/raises.py:score: importing it failed (RuntimeError: no GPU " \
                          "quota); fix the module"
    assert problems[1].startswith(f"`reward_funcs`: {tmp_path}/narrow.py:score cannot take the arguments the trainer "
                                  "passes (prompts, completions, completion_ids, trainer_state, log_extra, "
                                  "log_metric): got an unexpected keyword argument 'prompts'")
    assert problems[2].startswith("trl.RLOOConfig refuses these values: ValueError: auto_find_batch_size is not "
                                  "supported by RLOO")  # a rule only TRL knows: the config's own check finds it


def test_a_check_that_passed_holds_for_the_run_elsewhere_or_resumed_and_not_for_other_values() -> None:
    """What the check never reads (where the run writes, the checkpoint it resumes, which the resolver checked)
    leaves the key alone; a trainer value or the ranks' environment changes it."""
    values = {"learning_rate": 1e-3, "output_dir": "runs/a", "resume_from_checkpoint": None}
    payload = {"algorithm": "rloo", "values": values, "processes": 2}
    env = {"DS_ACCELERATOR": "cpu"}
    key = check_key(payload, env)
    elsewhere = {**values, "output_dir": "runs/b", "logging_dir": "runs/b/logs", "run_name": "b",
                 "resume_from_checkpoint": "runs/a/checkpoint-4"}
    assert check_key({**payload, "values": elsewhere}, env) == key
    assert check_key({**payload, "values": {**values, "learning_rate": 1e-2}}, env) != key
    assert check_key(payload, {**env, "RLHF_GREETING": "hello"}) != key
    assert check_key({**payload, "processes": 4}, env) != key


def test_a_run_that_fits_passes_with_the_launcher_free_of_torch_and_is_checked_again_only_when_changed(
        tmp_path: Path) -> None:
    good = write(tmp_path / "good.py",
                 "def score(prompts, completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    passed = {"problems": [], "heavy_in_launcher": []}
    assert run_check(tmp_path, "reward_funcs=[good.py:score]") == {**passed, "remembered": False}
    # The same run again (another output dir, as every default one is): no process, no TRL import.
    assert run_check(tmp_path, "reward_funcs=[good.py:score]", "output_dir=elsewhere") == {**passed, "remembered": True}
    write(good, good.read_text() + "# edited\n")  # the reward file changed: checked again
    assert run_check(tmp_path, "reward_funcs=[good.py:score]") == {**passed, "remembered": False}
    assert len(list((Path(os.environ["RLHF_CACHE"]) / "passed-checks").iterdir())) == 2


TOOL_DOC = '    """Add.\n\n    Args:\n        a: a number\n    """\n'
METHOD_DOC = TOOL_DOC.replace("\n    ", "\n        ").replace('    """Add', '        """Add', 1)
ENVIRONMENTS = f"""
class Broken:
    def __init__(self):
        raise RuntimeError("no sandbox")

class NoReset:
    def add(self, a: int) -> int:
{METHOD_DOC}        return a

class Loose:
    def reset(self, **kwargs):
        return None
    def add(self, a, b: int) -> int:
{METHOD_DOC}        return a
"""


def test_tools_that_transformers_cannot_describe_and_a_template_without_tool_calls_are_found(tmp_path: Path) -> None:
    write(tmp_path / "raises.py", "raise ImportError('no calculator')\n")
    write(tmp_path / "nohint.py", f"def add(a):\n{TOOL_DOC}    return a\n")
    write(tmp_path / "noargs.py", "def add(a: int, b: int) -> int:\n    \"\"\"Add.\"\"\"\n    return a\n")
    write(tmp_path / "env.py", ENVIRONMENTS)
    write(tmp_path / "value.py", "rollout = 3\n")
    write(tmp_path / "rows.jsonl", '{"prompt": [{"role": "user", "content": "add"}], "environment": "a"}\n')
    problems = run_check(tmp_path, "tools=[raises.py:add, nohint.py:add, noargs.py:add]",
                         "environment_factory={a: env.py:Broken, b: env.py:NoReset, c: env.py:Loose}",
                         "rollout_func=value.py:rollout", "dataset_name=rows.jsonl", recipe="grpo/smoke")["problems"]
    assert problems == [
        f"`tools`: {tmp_path}/raises.py:add: importing it failed (ImportError: no calculator); fix the module",
        f"`tools`: {tmp_path}/nohint.py:add: transformers cannot turn it into a tool schema (Argument a is missing a "
        "type hint in function add); give every argument a type hint and a line in the docstring's Args: section",
        f"`tools`: {tmp_path}/noargs.py:add: transformers cannot turn it into a tool schema (Cannot generate JSON "
        "schema for add because the docstring has no description for the argument 'a'); give every argument a type "
        "hint and a line in the docstring's Args: section",
        f"`environment_factory.a`: {tmp_path}/env.py:Broken: building one failed (RuntimeError: no sandbox); "
        "GRPOTrainer builds it with no arguments, once per rollout",
        f"`environment_factory.b`: {tmp_path}/env.py:NoReset has no `reset` method; GRPOTrainer calls reset(**row) "
        "before each rollout",
        f"`environment_factory.c`: {tmp_path}/env.py:Loose: method `add` is a tool, and transformers cannot turn it "
        "into a tool schema (Argument a is missing a type hint in function add); give every argument a type hint "
        "and a line in the docstring's Args: section (or make it _private)",
        f"`rollout_func`: {tmp_path}/value.py:rollout is a int, not a function or class",
        f"`model_name_or_path` ({RECIPES}/smoke/policy): its chat template cannot render a tool-calling conversation "
        "(TRL's supports_tool_calling: user -> assistant with tool_calls -> tool); use a model whose template does "
        "(Qwen 2.5, Llama 3.1)",
    ]


TRL_STYLE = """
def reward(completions, answer, **kwargs):
    return [0.0 for _ in completions]

def judged(completions, environments, **kwargs):
    return [env.get_reward() for env in environments]

def asks_a_column_it_lacks(completions, question, **kwargs):
    return [0.0 for _ in completions]

def rollout(prompts):
    return {}

class Counter:
    def reset(self, **kwargs):
        self.count = 0
        return "Count up."

    def increment(self, step: int) -> str:
        \"\"\"Add to the counter.

        Args:
            step: How much to add.
        \"\"\"
        self.count += step
        return str(self.count)

    def get_reward(self) -> float:
        return float(self.count)

class NoRow:
    def reset(self):
        return None

class Raises:
    def reset(self, **kwargs):
        raise RuntimeError("no sandbox for " + kwargs["answer"])

class Rewardless:
    def reset(self, **kwargs):
        return None
"""
TRL_ROWS = "".join(json.dumps({"prompt": [{"role": "user", "content": "What is 1 + 1?"}], "answer": "2",
                               "solution": "2", "environment": name}) + "\n" for name in ("a", "b"))


def test_trls_reward_and_environment_signatures_are_bound_as_grpo_trainer_binds_them(tmp_path: Path) -> None:
    """GRPOTrainer passes each reward the dataset's columns and, with environments, `environments`; TRL's own
    accuracy_reward reads `solution`; an environment's get_reward may be the only reward, with no dataset."""
    write(tmp_path / "trl_style.py", TRL_STYLE)
    write(tmp_path / "rows.jsonl", TRL_ROWS)
    passed = run_check(tmp_path, "reward_funcs=[trl_style.py:reward, trl_style.py:judged]",
                       "environment_factory=trl_style.py:Counter", "dataset_name=rows.jsonl", recipe="grpo/agent-smoke")
    assert passed["problems"] == []
    owns = write(tmp_path / "owns.yaml", f"model_name_or_path: {RECIPES}/smoke/agent\n"
                 "environment_factory: trl_style.py:Counter\nmax_steps: 2\nper_device_train_batch_size: 2\n"
                 "num_generations: 2\nnum_processes: 2\n")
    assert run_check(tmp_path, recipe=str(owns), command="grpo")["problems"] == []
    assert run_check(tmp_path, "environment_factory=trl_style.py:Rewardless", recipe=str(owns),
                     command="grpo")["problems"] == [
        "no reward: `environment_factory` has no get_reward method and the recipe sets no `reward_funcs` or reward "
        "model; add one (TRL scores a rollout by get_reward() alone only when the environment has it)"]
    keywords = ("prompts, completions, completion_ids, trainer_state, log_extra, log_metric, environments, answer, "
                "solution, environment")
    refused = run_check(tmp_path, "reward_funcs=[accuracy_reward, trl_style.py:asks_a_column_it_lacks]",
                        "environment_factory={a: trl_style.py:NoRow, b: trl_style.py:Raises}",
                        "rollout_func=trl_style.py:rollout", "dataset_name=rows.jsonl",
                        recipe="grpo/agent-smoke")["problems"]
    row = "prompt, answer, solution"
    assert refused == [
        "`reward_funcs`: accuracy_reward needs the `math_verify` package, which is not installed: pip install "
        "math-verify",
        f"`reward_funcs`: {tmp_path}/trl_style.py:asks_a_column_it_lacks cannot take the arguments the trainer "
        f"passes ({keywords}): missing a required argument: 'question'; give it those it uses and **kwargs",
        f"`environment_factory.a`: {tmp_path}/trl_style.py:NoRow: reset cannot take the dataset row GRPOTrainer "
        f"passes it as keywords ({row}): got an unexpected keyword argument 'prompt'; write reset(self, **kwargs)",
        f"`environment_factory.b`: {tmp_path}/trl_style.py:Raises: reset(**row) raised RuntimeError: no sandbox for "
        f"2 on the dataset's first row ({row}); fix reset",
        f"`rollout_func`: {tmp_path}/trl_style.py:rollout cannot be called as GRPOTrainer calls it, "
        "rollout_func(prompts, trainer): too many positional arguments; give it both arguments",
    ]


def test_the_agent_smoke_recipe_passes_the_check(tmp_path: Path) -> None:
    passed = {"problems": [], "heavy_in_launcher": [], "remembered": False}
    assert run_check(tmp_path, recipe="grpo/agent-smoke") == passed


def test_a_template_that_loses_prefixes_or_has_no_parser_is_refused() -> None:
    """The two template checks TRL makes once it has the tools: a prefix-preserving template (or one TRL can swap)
    and a response parser it knows; the agent stand-in's (TRL's Qwen 2.5 template) passes both."""
    from transformers import AutoTokenizer

    from rlhf_cli.rank.prelaunch_tools import template_problems

    assert template_problems(AutoTokenizer.from_pretrained(RECIPES / "smoke" / "agent"), "agent") == []
    tokenizer = AutoTokenizer.from_pretrained(RECIPES / "smoke" / "agent")  # the check gave the first a parser
    tokenizer.chat_template = (  # renders every part of a tool call, and marks the last turn only: loses prefixes
        "{% for m in messages %}{{ m.role }}:{{ m.content }}{% for t in m.tool_calls or [] %}{{ t.function.name }}"
        "{{ t.function.arguments | tojson }}{% endfor %}{% if loop.last %}<|im_end|>{% endif %}{% endfor %}")
    assert template_problems(tokenizer, "m") == [
        "`model_name_or_path` (m): its chat template is not prefix-preserving (an earlier turn renders differently "
        "once a tool result follows) and TRL has no training template for it",
        "`model_name_or_path` (m): its tokenizer has no response schema to parse tool calls with and TRL knows none "
        "for its chat template; set `response_template` in its tokenizer_config.json"]


def test_a_reward_module_that_hangs_is_stopped_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    write(tmp_path / "hangs.py", "import subprocess, time\n"
                                 f"child = subprocess.Popen(['sleep', '600'])\nopen({str(pid_file)!r}, 'w')"
                                 ".write(str(child.pid))\ntime.sleep(600)\n"
                                 "def score(**kwargs):\n    return []\n")
    run = resolve(RunRequest("rloo", "rloo/smoke", sets=("reward_funcs=[hangs.py:score]",)), cwd=tmp_path, cuda=False)
    with pytest.raises(ConfigError) as raised:
        check_before_launch(run, timeout=8)
    assert raised.value.problems == [f"the pre-launch check did not finish in 8 s while importing reward function "
                                     f"{tmp_path}/hangs.py:score; a reward module that waits on something at import "
                                     "hangs every rank too"]
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10  # SIGKILL is sent; on a busy machine the process takes a moment to go
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)


def alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def test_a_reward_module_that_exits_the_process_is_reported(tmp_path: Path) -> None:
    write(tmp_path / "quits.py", "import os\nos._exit(3)\ndef score(**kwargs):\n    return []\n")
    run = resolve(RunRequest("rloo", "rloo/smoke", sets=("reward_funcs=[quits.py:score]",)), cwd=tmp_path, cuda=False)
    with pytest.raises(ConfigError, match=r"ended with exit code 3 while importing reward function .*quits.py:score"):
        check_before_launch(run, timeout=120)


def test_num_generations_3_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    """The real command, nothing stubbed: exit 2 in about a second, no output dir, no rank."""
    out = tmp_path / "out"
    done = launch_rlhf("rloo", out, "--set", "num_generations=3", env={"PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "Error: `num_generations` (3) must divide the generation batch (4 = per_device_train_batch_size x processes "
        "x steps per generation): set num_generations to 2, or per_device_train_batch_size to a multiple of 3"]
    assert not out.exists()  # the ranks write their records there first


def test_the_remembered_check_is_keyed_on_every_file_the_run_executes_and_the_chat_template(tmp_path: Path) -> None:
    """Tools, environments and the rollout function as reward files are; the policy's chat template with tools;
    code from a module, or tools with a policy that is not a local directory, are checked every time."""
    from rlhf_cli.launch.prelaunch import check_key

    model = tmp_path / "model"
    write(model / "chat_template.jinja", "{{ messages }}")
    code = {name: write(tmp_path / f"{name}.py", f"# {name}\n") for name in ("tools", "env", "rollout", "reward")}
    values = {"model_name_or_path": str(model), "reward_funcs": [f"{code['reward']}:score"],
              "tools": [f"{code['tools']}:add"], "environment_factory": {"a": f"{code['env']}:Sandbox"},
              "rollout_func": f"{code['rollout']}:generate"}

    def key(**changed: object) -> str | None:
        return check_key({"algorithm": "grpo", "values": {**values, **changed}, "processes": 2}, {})

    first = key()
    assert first is not None and key() == first
    for path in (*code.values(), model / "chat_template.jinja"):
        write(path, path.read_text() + "# edited\n")
        assert key() != first, path
        first = key()
    assert key(tools=["my_pkg.tools:add"]) is None
    assert key(model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct") is None
    assert key(tools=None, environment_factory=None, model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct") is not None


def _config(path: Path, model_type: str, architecture: str) -> str:
    """A small config.json of `model_type` (its class's defaults for what is not said)."""
    write(path / "config.json", json.dumps({
        "model_type": model_type, "architectures": [architecture], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 128}))
    return str(path)


def test_a_reward_or_value_model_of_a_family_with_no_sequence_classifier_is_refused(tmp_path: Path) -> None:
    """Granite has no sequence-classification class in transformers: every rank would die loading it as a reward
    model; a llama loads as one (with a new score head). PPO's value model starts from the policy when neither a
    value nor a reward model is named."""
    from rlhf_cli.rank.inputs import RankInputs
    from rlhf_cli.rank.prelaunch_models import classifier_problems

    granite = _config(tmp_path / "granite", "granite", "GraniteForCausalLM")
    llama = _config(tmp_path / "llama", "llama", "LlamaForCausalLM")
    (problem,) = classifier_problems(RankInputs.from_values("grpo", {"reward_model_name_or_path": granite}))
    assert problem.startswith(f"`reward_model_name_or_path`: {granite} is a granite model, and transformers has no "
                              "sequence-classification class for granite")
    assert classifier_problems(RankInputs.from_values("grpo", {"reward_model_name_or_path": llama})) == []
    ppo = {"model_name_or_path": granite, "reward_model_name_or_path": llama}
    assert classifier_problems(RankInputs.from_values("ppo", ppo)) == []  # the value model starts from the reward's
    (problem,) = classifier_problems(RankInputs.from_values("ppo", {"model_name_or_path": granite}))
    assert problem.startswith(f"`value_model_name_or_path`: {granite} (the policy: PPO's value model starts from it)")
    assert classifier_problems(RankInputs.from_values("grpo", {"reward_model_name_or_path": "org/not-here"})) == []
