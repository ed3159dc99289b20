"""Recipe + flags -> resolved run: precedence, sources, types, legacy keys, paths, all problems at once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import RECIPES, write
from rlhf_cli.config.resolve import RunRequest, Setting, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.output.ownership import record_end
from rlhf_cli.output.run_dir import RunDir

SMOKE_MODELS = f"""
model_name_or_path: {RECIPES}/smoke/policy
reward_model_name_or_path: {RECIPES}/smoke/reward
dataset_name: {RECIPES}/smoke/prompts.jsonl
"""


def recipe(tmp_path: Path, body: str, name: str = "recipe.yaml") -> str:
    return str(write(tmp_path / name, SMOKE_MODELS + body))


def problems(request: RunRequest, tmp_path: Path) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        resolve(request, cwd=tmp_path, cuda=False)
    return raised.value.problems


def test_precedence_default_recipe_flag_and_set(tmp_path: Path) -> None:
    path = recipe(tmp_path, "learning_rate: 2.0e-5\nmax_steps: 10\nseed: 1\n")
    run = resolve(RunRequest("rloo", path, flags={"max_steps": ("--max-steps", 3)}, sets=("seed=7",)),
                  cwd=tmp_path, cuda=False)
    assert run.settings["learning_rate"].value == 2.0e-5 and run.settings["learning_rate"].source == "recipe"
    assert run.settings["max_steps"].value == 3 and run.settings["max_steps"].source == "flag --max-steps"
    assert run.settings["seed"].value == 7 and run.settings["seed"].source == "--set"
    assert "beta" not in run.settings  # untouched fields keep TRL's default and are not listed
    assert run.value("beta") == 0.05


def test_gather_flag_beats_recipe_and_defaults_to_trl(tmp_path: Path) -> None:
    path = recipe(tmp_path, "gather: true\n")
    run = resolve(RunRequest("rloo", path, flags={"ds3_gather_for_generation": ("--no-gather", False)}),
                  cwd=tmp_path, cuda=False)
    assert run.group("trainer")["ds3_gather_for_generation"] is False
    assert run.settings["ds3_gather_for_generation"].source == "flag --no-gather"
    unset = resolve(RunRequest("rloo", recipe(tmp_path, "", "plain.yaml")), cwd=tmp_path, cuda=False)
    assert unset.settings["ds3_gather_for_generation"].value is True
    assert unset.settings["ds3_gather_for_generation"].source == "default"


def test_trl_style_recipe_with_ds3_key_works_unchanged(tmp_path: Path) -> None:
    path = recipe(tmp_path, "ds3_gather_for_generation: false\ndataset_train_split: train\n"
                            "reward_funcs: [think_format_reward]\nlearning_rate: 3e-6\n")
    run = resolve(RunRequest("rloo", path), cwd=tmp_path, cuda=False)
    assert run.value("ds3_gather_for_generation") is False
    assert run.value("learning_rate") == 3e-6  # YAML 1.1 reads 3e-6 as a string; we accept it as a number


def test_set_values_are_yaml_scalars_checked_against_the_field(tmp_path: Path) -> None:
    path = recipe(tmp_path, "")
    run = resolve(RunRequest("rloo", path, sets=("report_to=[tensorboard]", "temperature=0.7",
                                                 "stage3_prefetch_bucket_size=2000")), cwd=tmp_path, cuda=False)
    assert run.value("report_to") == ["tensorboard"]
    assert run.value("temperature") == 0.7
    assert run.group("zero3") == {"stage3_prefetch_bucket_size": 2000}
    found = problems(RunRequest("rloo", path, sets=("max_steps=two",)), tmp_path)
    assert found == ["--set max_steps: `max_steps`: expected an integer, got 'two' (str)"]


def test_every_problem_is_reported_at_once_with_place_and_fix(tmp_path: Path) -> None:
    path = recipe(tmp_path, "learning_rat: 1.0e-5\nmax_steps: many\nlr_scheduler_type: cosin\n")
    found = problems(RunRequest("rloo", path, sets=("bogus",)), tmp_path)
    assert f"{path}:5: unknown key `learning_rat`; did you mean `learning_rate`?" in found
    assert f"{path}:6: `max_steps`: expected an integer, got 'many' (str)" in found
    assert any(p.startswith(f"{path}:7: `lr_scheduler_type`: expected one of linear, cosine") for p in found)
    assert "--set bogus: expected KEY=VALUE" in found
    assert len(found) == 4


def test_ppo_takes_trls_importance_sampling_keys_and_their_deprecated_name(tmp_path: Path) -> None:
    """TRL 1.16's names and defaults (sequence_mask, clip_max 3); the deprecated cap is clip_max under its old
    name; bounds that cannot work are refused before launch, as TRL's GRPOConfig refuses them."""
    smoke = str(RECIPES / "ppo" / "smoke.yaml")
    run = resolve(RunRequest("ppo", smoke), cwd=tmp_path, cuda=False)
    assert (run.value("vllm_importance_sampling_mode"), run.value("vllm_importance_sampling_clip_max"),
            run.value("vllm_importance_sampling_clip_min")) == ("sequence_mask", 3.0, None)
    old = resolve(RunRequest("ppo", smoke, sets=("vllm_importance_sampling_cap=2",)), cwd=tmp_path, cuda=False)
    assert old.value("vllm_importance_sampling_clip_max") == 2
    assert ("--set vllm_importance_sampling_cap: `vllm_importance_sampling_cap` is the old name of "
            "`vllm_importance_sampling_clip_max`; using it as `vllm_importance_sampling_clip_max`") in old.notes
    crossed = problems(RunRequest("ppo", smoke, sets=("vllm_importance_sampling_clip_min=3",)), tmp_path)
    assert crossed == ["`vllm_importance_sampling_clip_min` (3) must be less than "
                       "`vllm_importance_sampling_clip_max` (3.0)"]
    unbounded = problems(RunRequest("ppo", smoke, sets=("vllm_importance_sampling_mode=token_truncate",
                                                        "vllm_importance_sampling_clip_max=null")), tmp_path)
    assert unbounded == ["`vllm_importance_sampling_mode: token_truncate` clips the importance-sampling ratios and "
                         "neither `vllm_importance_sampling_clip_min` nor `vllm_importance_sampling_clip_max` is set: "
                         "set one"]
    wrong = problems(RunRequest("ppo", smoke, sets=("vllm_importance_sampling_mode=sequence",)), tmp_path)
    assert len(wrong) == 1 and "expected one of token_truncate, token_mask, sequence_truncate, sequence_mask" in \
        wrong[0]


def test_legacy_names_are_mapped_with_a_note_or_refused_with_todays_field(tmp_path: Path) -> None:
    path = recipe(tmp_path, "rloo_k: 4\nsft_model_path: ./other-policy\n", "legacy.yaml")
    found = problems(RunRequest("rloo", path), tmp_path)
    assert found == [f"{path}:6: `sft_model_path` sets `model_name_or_path` again (already set by {path}:2); in "
                     "TRL 0.14's PPO `sft_model_path` was the policy and reference and `model_name_or_path` only the "
                     "tokenizer; rlhf loads all three from `model_name_or_path`: give it the SFT model (with its "
                     "tokenizer) and drop the other"]
    ok = write(tmp_path / "legacy2.yaml", f"rloo_k: 4\nsft_model_path: {RECIPES}/smoke/policy\n"
                                          f"reward_model_path: {RECIPES}/smoke/reward\n"
                                          f"dataset_name: {RECIPES}/smoke/prompts.jsonl\n")
    run = resolve(RunRequest("rloo", str(ok)), cwd=tmp_path, cuda=False)
    assert run.value("num_generations") == 4
    assert run.value("model_name_or_path") == str(RECIPES / "smoke" / "policy")
    assert f"{ok}:1: `rloo_k` is the old name of `num_generations`; using it as `num_generations`" in run.notes
    ok = str(ok)
    refused = problems(RunRequest("rloo", ok, sets=("total_episodes=200",)), tmp_path)
    assert refused == ["--set total_episodes: `total_episodes` (a ppo key) has no counterpart in today's rloo: set "
                       "`max_steps` (one step consumes per_device_train_batch_size x gradient_accumulation_steps "
                       "x processes completions)"]


def test_online_dpo_reward_model_path_is_never_silently_ignored(tmp_path: Path) -> None:
    path = write(tmp_path / "odpo.yaml", f"model_name_or_path: {RECIPES}/smoke/policy\n"
                                        f"reward_model_path: {RECIPES}/smoke/reward\n"
                                        f"dataset_name: {RECIPES}/smoke/prompts.jsonl\n")
    run = resolve(RunRequest("online_dpo", str(path)), cwd=tmp_path, cuda=False)
    assert run.value("reward_model_name_or_path") == str(RECIPES / "smoke" / "reward")
    assert "reward_model_path" not in run.settings


def test_relative_paths_resolve_from_the_recipe_then_the_working_dir(tmp_path: Path) -> None:
    run = resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml")), cwd=tmp_path, cuda=False)
    assert run.value("model_name_or_path") == str(RECIPES / "smoke" / "policy")
    write(tmp_path / "data" / "prompts.csv", "prompt\nhello\n")
    run = resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"),
                             flags={"dataset_name": ("--dataset", "data/prompts.csv")}), cwd=tmp_path, cuda=False)
    assert run.value("dataset_name") == str(tmp_path / "data" / "prompts.csv")
    assert run.value("output_dir").startswith(str(tmp_path / "runs" / "rloo-"))


def test_missing_things_are_named(tmp_path: Path) -> None:
    write(tmp_path / "notes.txt", "x")
    write(tmp_path / "empty-model" / "weights.bin", "")
    found = problems(RunRequest("rloo", None, flags={
        "model_name_or_path": ("--model", "./empty-model"), "dataset_name": ("--dataset", "notes.txt"),
        "reward_model_name_or_path": ("--reward-model", "./no-such-reward"),
    }), tmp_path)
    assert found == [
        "--model: `model_name_or_path`: ./empty-model has no config.json; is it a saved model directory?",
        "--dataset: `dataset_name`: notes.txt is not a .json, .jsonl, .parquet or .csv file",
        "--reward-model: `reward_model_name_or_path`: model directory ./no-such-reward not found",
    ]
    assert problems(RunRequest("rloo"), tmp_path) == [
        "no policy model: set `model_name_or_path` in the recipe or pass --model",
        "no dataset: set `dataset_name` in the recipe or pass --dataset",
        "no reward: set `reward_model_name_or_path` (or --reward-model) and/or `reward_funcs`",
    ]


def test_reward_functions_from_files_and_modules(tmp_path: Path) -> None:
    write(tmp_path / "rewards.py", "def length(completions, **kw):\n    return [len(c) for c in completions]\n")
    write(tmp_path / "my_pkg" / "scores.py", "def fn(completions, **kw):\n    return [0.0 for c in completions]\n")
    path = write(tmp_path / "r.yaml", SMOKE_MODELS + "reward_funcs: [rewards.py:length, my_pkg.scores:fn]\n")
    run = resolve(RunRequest("rloo", str(path)), cwd=tmp_path, cuda=False)
    assert run.value("reward_funcs") == [f"{tmp_path}/rewards.py:length", "my_pkg.scores:fn"]
    bad = write(tmp_path / "bad.yaml", SMOKE_MODELS + "reward_funcs: [missing.py:length]\n")
    assert problems(RunRequest("rloo", str(bad)), tmp_path) == [
        f"{bad}:5: `reward_funcs`: file missing.py not found"]


def test_tools_environments_and_rollouts_are_found_like_reward_functions(tmp_path: Path) -> None:
    """Files relative to the recipe (or, from the command line, to the working directory), modules as named; each
    value keeps its source for --dry-run."""
    write(tmp_path / "agent" / "tools.py", "def add(a: int) -> int:\n    return a\nclass Sandbox:\n    pass\n")
    write(tmp_path / "my_pkg" / "rollouts.py", "def rollout(prompts, trainer):\n    return {}\n")
    write(tmp_path / "agent" / "rows.jsonl", '{"prompt": [{"role": "user", "content": "1 + 1"}], "environment": "math"}\n')
    models = SMOKE_MODELS.replace(f"{RECIPES}/smoke/prompts.jsonl", "rows.jsonl")
    path = write(tmp_path / "agent" / "r.yaml", models + "tools: [tools.py:add, my_pkg.rollouts:rollout]\n"
                 "environment_factory: {math: tools.py:Sandbox}\n")
    run = resolve(RunRequest("grpo", str(path), sets=("rollout_func=my_pkg.rollouts:rollout",)), cwd=tmp_path,
                  cuda=False)
    assert run.value("tools") == [f"{tmp_path}/agent/tools.py:add", "my_pkg.rollouts:rollout"]
    assert run.value("environment_factory") == {"math": f"{tmp_path}/agent/tools.py:Sandbox"}
    assert (run.value("rollout_func"), run.settings["rollout_func"].source) == ("my_pkg.rollouts:rollout", "--set")
    assert run.settings["tools"].source == "recipe"
    assert problems(RunRequest("grpo", str(path), sets=("tools=[tools.py:add]",)), tmp_path) == [
        "--set tools: `tools`: file tools.py not found"]  # on the command line: relative to the working directory


def test_agent_datasets_are_read_as_grpo_trainer_reads_them(tmp_path: Path) -> None:
    """An environment may own the data (no dataset, `max_steps` steps) and the reward (its get_reward, which the
    pre-launch check looks for), as TRL lets it; a mapping of environments needs each row's `environment`, and
    tools need chat prompts. The prompt column may be absent when an environment writes the prompt in reset."""
    write(tmp_path / "env.py", "class Sandbox:\n    def reset(self, **kwargs):\n        return 'go'\n")
    chat = '{"prompt": [{"role": "user", "content": "1 + 1"}], "environment": "code"}\n'
    write(tmp_path / "rows.jsonl", chat)
    write(tmp_path / "plain.jsonl", '{"prompt": "1 + 1"}\n')
    write(tmp_path / "no-prompt.jsonl", '{"environment": "math"}\n')
    owns = write(tmp_path / "owns.yaml", f"model_name_or_path: {RECIPES}/smoke/agent\n"
                 "environment_factory: env.py:Sandbox\nmax_steps: 3\n")
    run = resolve(RunRequest("grpo", str(owns)), cwd=tmp_path, cuda=False)
    assert run.value("dataset_name") is None and not run.value("reward_funcs")
    assert resolve(RunRequest("grpo", str(owns), sets=("environment_factory={math: env.py:Sandbox}",
                                                         "dataset_name=no-prompt.jsonl")), cwd=tmp_path, cuda=False)
    assert problems(RunRequest("grpo", str(owns), sets=("max_steps=-1",)), tmp_path) == [
        "no dataset: an environment that owns its data trains for `max_steps` steps (TRL's rule without a dataset); "
        "set max_steps (or --max-steps), or `dataset_name`"]
    assert problems(RunRequest("grpo", str(owns), sets=("environment_factory={math: env.py:Sandbox}",)),
                    tmp_path) == ["no dataset: a mapping `environment_factory` picks each row's environment by the "
                                  "dataset's `environment` column; set `dataset_name`, or name one environment class"]
    assert problems(RunRequest("grpo", str(owns), sets=("environment_factory={math: env.py:Sandbox}",
                                                          "dataset_name=rows.jsonl")), tmp_path) == [
        f"--set dataset_name: {tmp_path}/rows.jsonl:1: `environment` is 'code', not one of `environment_factory`'s "
        "(math)"]
    assert problems(RunRequest("grpo", str(owns), sets=("dataset_name=plain.jsonl",)), tmp_path) == [
        f"--set dataset_name: {tmp_path}/plain.jsonl:1: `prompt` is plain text, and with `tools` or "
        "`environment_factory` GRPOTrainer renders the tools only into chat messages; write each prompt as "
        '[{"role": "user", "content": ...}]']
    assert problems(RunRequest("grpo", str(owns), sets=("environment_factory=null",)), tmp_path) == [
        "no dataset: set `dataset_name` in the recipe or pass --dataset",
        "no reward: set `reward_model_name_or_path` (or --reward-model) and/or `reward_funcs`"]


def test_nvme_offload_needs_a_path(tmp_path: Path) -> None:
    path = recipe(tmp_path, "")
    found = problems(RunRequest("rloo", path, flags={"offload_optimizer": ("--offload-optimizer", "nvme")}), tmp_path)
    assert found == ["offload_optimizer_device is nvme but no --nvme-path DIR is given"]


def test_flag_and_set_for_the_same_key_is_an_error(tmp_path: Path) -> None:
    path = recipe(tmp_path, "")
    found = problems(RunRequest("rloo", path, flags={"max_steps": ("--max-steps", 3)}, sets=("max_steps=4",)),
                     tmp_path)
    assert found == ["--set max_steps: `max_steps` is set again (already set by --max-steps); keep one"]


def test_an_existing_run_is_not_overwritten(tmp_path: Path) -> None:
    write(tmp_path / "out" / "recipe.yaml", "")
    record_end(RunDir(tmp_path / "out"))  # what an earlier run leaves: its files, recorded as its own
    path = recipe(tmp_path, "output_dir: out\n")
    assert problems(RunRequest("rloo", path), tmp_path) == [
        f"{path}:5: output dir {tmp_path / 'out'} already holds a run (recipe.yaml, rlhf-files.json; unfinished); "
        "continue it with --resume auto, start it again with --overwrite (removes only what rlhf wrote there), or "
        "choose another --output-dir"]
    assert resolve(RunRequest("rloo", path, overwrite=True), cwd=tmp_path, cuda=False).output_dir == tmp_path / "out"


def test_cpu_machines_get_deepspeeds_cpu_path_unless_the_recipe_says_otherwise(tmp_path: Path) -> None:
    path = recipe(tmp_path, "bf16: true\n")
    cpu = resolve(RunRequest("rloo", path), cwd=tmp_path, cuda=False)
    assert cpu.accelerate["use_cpu"] is True and cpu.accelerate["mixed_precision"] == "no"
    assert cpu.value("ddp_backend") == "gloo" and cpu.value("fp16") is False
    assert cpu.settings["bf16"].source == "recipe"  # what the user wrote stands, on the CPU
    assert cpu.value("use_cpu") is True and "bf16 as asked, on the CPU (use_cpu: true)" in " ".join(cpu.notes)
    gpu = resolve(RunRequest("rloo", path), cwd=tmp_path, cuda=True)
    assert gpu.accelerate["use_cpu"] is False and "ddp_backend" not in gpu.settings
    fp32 = resolve(RunRequest("rloo", path, sets=("bf16=false",)), cwd=tmp_path, cuda=False)
    assert fp32.value("use_cpu") is False
    with pytest.raises(ConfigError, match="fp16 needs a GPU and this machine has none"):
        resolve(RunRequest("rloo", path, sets=("bf16=false", "fp16=true")), cwd=tmp_path, cuda=False)


def test_resolved_recipe_round_trips(tmp_path: Path) -> None:
    import yaml

    run = resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"), sets=("beta=0.1",)),
                  cwd=tmp_path, cuda=False)
    again_path = write(tmp_path / "again.yaml", yaml.safe_dump(run.recipe_values()))
    again = resolve(RunRequest("rloo", str(again_path)), cwd=tmp_path, cuda=False)
    assert again.recipe_values() == run.recipe_values()


def test_bare_reward_names_must_be_trls(tmp_path: Path) -> None:
    path = recipe(tmp_path, "reward_funcs: [think_format_reward, lenght]\n")
    assert problems(RunRequest("rloo", path), tmp_path) == [
        f"{path}:5: `reward_funcs`: 'lenght' is not one of TRL's (accuracy_reward, "
        "get_soft_overlong_punishment, reasoning_accuracy_reward, think_format_reward); write module:function or file.py:function"]


def ppo_problems(tmp_path: Path, *sets: str) -> list[str]:
    return problems(RunRequest("ppo", str(RECIPES / "ppo" / "smoke.yaml"), sets=sets), tmp_path)


def test_ppo_seed_recipe_keeps_the_seeds_values(tmp_path: Path) -> None:
    run = resolve(RunRequest("ppo", str(RECIPES / "ppo" / "pythia-12b-descriptiveness.yaml")), cwd=tmp_path,
                  cuda=True)
    seed = {"num_ppo_epochs": 1, "num_mini_batches": 1, "learning_rate": 3e-6, "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 16, "total_episodes": 200, "local_rollout_forward_batch_size": 16,
            "missing_eos_penalty": 1.0, "model_name_or_path": "EleutherAI/pythia-12b",
            "reward_model_name_or_path": "EleutherAI/pythia-70m"}
    assert {key: run.value(key) for key in seed} == seed
    assert run.accelerate["num_processes"] == 4
    assert run.accelerate["deepspeed_config"]["offload_optimizer_device"] == "cpu"


def test_ppo_seed_command_line_translates_one_to_one(tmp_path: Path) -> None:
    run = resolve(RunRequest("ppo", None, sets=(
        f"sft_model_path={RECIPES}/smoke/policy", f"reward_model_path={RECIPES}/smoke/reward",
        f"dataset_name={RECIPES}/smoke/prompts.jsonl", "num_ppo_epochs=1", "num_mini_batches=1",
        "total_episodes=200", "local_rollout_forward_batch_size=16", "missing_eos_penalty=1.0",
        "gradient_accumulation_steps=16", "per_device_train_batch_size=1")), cwd=tmp_path, cuda=False)
    assert run.value("total_episodes") == 200 and run.value("model_name_or_path") == str(RECIPES / "smoke" / "policy")


def test_the_seeds_model_and_sft_model_path_with_one_value_are_one_value(tmp_path: Path) -> None:
    """The seed's own command line gives --model_name_or_path and --sft_model_path the same value (before: "sets
    model_name_or_path again"); in a recipe too, a relative path and an absolute one to the same model."""
    policy = RECIPES / "smoke" / "policy"
    flags = {"model_name_or_path": ("--model", str(policy))}
    run = resolve(RunRequest("ppo", str(RECIPES / "ppo" / "smoke.yaml"), flags=flags,
                             sets=(f"sft_model_path={policy}",)), cwd=tmp_path, cuda=False)
    assert run.value("model_name_or_path") == str(policy)
    path = write(tmp_path / "seed.yaml", f"model_name_or_path: {policy}\nsft_model_path: {policy}\n"
                                         f"reward_model_path: {RECIPES}/smoke/reward\n"
                                         f"dataset_name: {RECIPES}/smoke/prompts.jsonl\n")
    assert resolve(RunRequest("ppo", str(path)), cwd=tmp_path, cuda=False).value("model_name_or_path") == str(policy)


def test_ppo_stop_token_and_stop_token_id_are_not_both_set(tmp_path: Path) -> None:
    assert ppo_problems(tmp_path, "stop_token_id=2") == [
        "`stop_token` (eos) and `stop_token_id` (2) are both set; keep one"]


def test_ppo_batch_sizes_must_tile(tmp_path: Path) -> None:
    """Rollouts per process: per_device_train_batch_size x gradient_accumulation_steps (2 x 2 in the smoke
    recipe), split into num_mini_batches, as in TRL 1.12."""
    assert ppo_problems(tmp_path, "local_rollout_forward_batch_size=3") == [
        "`local_rollout_forward_batch_size` (3) must divide the rollouts per process (per_device_train_batch_size x "
        "gradient_accumulation_steps = 4)"]
    assert ppo_problems(tmp_path, "total_episodes=4", "num_mini_batches=2") == [
        "`total_episodes` (4) is less than one batch of rollouts (4 per process x 2 processes = 8)"]
    assert ppo_problems(tmp_path, "num_mini_batches=3") == [
        "`num_mini_batches` (3) must divide the rollouts per process (per_device_train_batch_size x "
        "gradient_accumulation_steps = 4): each mini-batch is one optimizer step"]
    # As TRL 1.12 accepted it: 4 mini-batches of 1 rollout, each a micro-batch of its own size
    run = resolve(RunRequest("ppo", str(RECIPES / "ppo" / "smoke.yaml"), sets=("num_mini_batches=4",)), cwd=tmp_path,
                  cuda=False)
    assert run.value("num_mini_batches") == 4
    assert ppo_problems(tmp_path, "num_mini_batches=0") == [
        "--set num_mini_batches: `num_mini_batches`: must be at least 1, got 0"]


def test_reward_model_is_a_sequence_classifier_or_a_causal_lm(tmp_path: Path) -> None:
    """The seed's reward model, pythia-70m, is a GPTNeoXForCausalLM: the ranks give it a new score head."""
    gpt2 = Path(shutil.copytree(RECIPES / "smoke" / "reward", tmp_path / "gpt2"))  # weights and tokenizer
    write(gpt2 / "config.json", '{"architectures": ["GPT2LMHeadModel"]}')
    for algorithm in ("ppo", "rloo", "online_dpo"):
        smoke = str(RECIPES / algorithm / "smoke.yaml")
        for causal_lm in (RECIPES / "smoke" / "policy", gpt2):
            resolve(RunRequest(algorithm, smoke, sets=(f"reward_model_name_or_path={causal_lm}",)), cwd=tmp_path,
                    cuda=False)
    masked_lm = write(tmp_path / "masked-lm" / "config.json", '{"architectures": ["BertForMaskedLM"]}').parent
    assert ppo_problems(tmp_path, f"reward_model_name_or_path={masked_lm}") == [
        f"`reward_model_name_or_path`: {masked_lm} is a BertForMaskedLM, neither a sequence classifier nor a "
        "causal LM (save it with AutoModelForSequenceClassification, num_labels=1)"]


def test_ppo_tokenizer_needs_eos_and_stop_token_in_vocab_but_not_pad(tmp_path: Path) -> None:
    """pythia, GPT-2, Llama 3 and Mistral ship no pad token: the ranks add one."""
    import shutil

    model = tmp_path / "policy"
    shutil.copytree(RECIPES / "smoke" / "policy", model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    resolve(RunRequest("ppo", str(RECIPES / "ppo" / "smoke.yaml"), sets=(f"model_name_or_path={model}",)),
            cwd=tmp_path, cuda=False)
    config.pop("eos_token", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    found = ppo_problems(tmp_path, f"model_name_or_path={model}", "stop_token=null", "stop_token_id=100000")
    assert found == [f"`model_name_or_path`: the tokenizer in {model} has no eos_token; PPO needs one",
                     f"`stop_token_id` 100000 is not in the vocabulary of {model} (0..499)"]


def test_values_trl_takes_beyond_its_type_are_taken_with_trls_meaning(tmp_path: Path) -> None:
    path = recipe(tmp_path, "scale_rewards: false\nresume_from_checkpoint: false\ntorch_dtype: bfloat16\n"
                            "reward_funcs: [get_soft_overlong_punishment, think_format_reward]\n")
    run = resolve(RunRequest("grpo", path), cwd=tmp_path, cuda=False)
    assert run.value("scale_rewards") == "none"  # GRPOConfig.__post_init__ maps false to "none", true to "group"
    assert run.value("resume_from_checkpoint") is None  # Trainer.train(False): start from the beginning
    assert run.value("dtype") == "bfloat16"
    assert f"{path}:7: `torch_dtype` is the old name of `dtype`; using it as `dtype`" in run.notes
    assert run.value("reward_funcs") == ["get_soft_overlong_punishment", "think_format_reward"]
    overridden = resolve(RunRequest("grpo", path, sets=("scale_rewards=batch",)), cwd=tmp_path, cuda=False)
    assert overridden.settings["scale_rewards"].value == "batch"
    assert overridden.settings["scale_rewards"].source == "--set"
    grouped = resolve(RunRequest("grpo", path, sets=("scale_rewards=true",)), cwd=tmp_path, cuda=False)
    assert grouped.value("scale_rewards") == "group"


def test_resume_from_checkpoint_true_is_resume_auto(tmp_path: Path) -> None:
    path = recipe(tmp_path, "resume_from_checkpoint: true\n")
    out = tmp_path / "out"
    run = resolve(RunRequest("rloo", path, flags={"output_dir": ("--output-dir", str(out))}), cwd=tmp_path,
                  cuda=False)
    assert run.value("resume_from_checkpoint") is None
    assert run.settings["resume_from_checkpoint"].source == "recipe auto: nothing to resume"
    assert problems(RunRequest("rloo", path), tmp_path) == [
        "--resume auto looks for checkpoints in the output dir, and the default runs/ALGO-TIME is new every time: "
        "pass --output-dir DIR"]


def test_a_key_given_twice_is_reported_with_the_files_other_problems(tmp_path: Path) -> None:
    path = recipe(tmp_path, "seed: 1\nseed: 1\nmax_steps: many\n")
    assert problems(RunRequest("rloo", path, sets=("bogus=1",)), tmp_path) == [
        f"{path}:6: `seed` is given again (first on line 5); YAML would keep only the last: keep one",
        f"{path}:7: `max_steps`: expected an integer, got 'many' (str)",
        "--set bogus: unknown key `bogus`"]
    accelerate = write(tmp_path / "accelerate.yaml", "num_processes: 2\nnum_processes: 2\nnum_machines: -1\n")
    found = problems(RunRequest("rloo", recipe(tmp_path, "", "plain.yaml"),
                                flags={"accelerate_config": ("--accelerate-config", str(accelerate))}), tmp_path)
    assert f"{accelerate}:2: `num_processes` is given again (first on line 1); YAML would keep only the last: " \
           "keep one" in found
    assert len(found) == 2, found


def test_without_a_process_count_the_run_starts_what_trl_would(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    home = tmp_path / "hf"
    environ = {"HF_HOME": str(home)}
    plain = recipe(tmp_path, "")
    run = resolve(RunRequest("rloo", plain), cwd=tmp_path, cuda=False, environ=environ)
    assert run.settings["num_processes"] == Setting(1, "one process: no GPU visible")  # not the bundled config's 8
    assert run.accelerate["num_processes"] == 1
    gpus = recipe(tmp_path, "env:\n  CUDA_VISIBLE_DEVICES: '0,1,2'\n", "gpus.yaml")
    run = resolve(RunRequest("rloo", gpus), cwd=tmp_path, cuda=False, environ=environ)
    assert run.settings["num_processes"] == Setting(3, "one per visible GPU (CUDA_VISIBLE_DEVICES=0,1,2)")
    config = write(home / "accelerate" / "default_config.yaml", "num_processes: 4\n")
    run = resolve(RunRequest("rloo", gpus), cwd=tmp_path, cuda=False, environ=environ)
    assert run.settings["num_processes"] == Setting(4, f"your default accelerate config {config}")
    given = resolve(RunRequest("rloo", recipe(tmp_path, "num_processes: 2\n", "two.yaml")), cwd=tmp_path,
                    cuda=False, environ=environ)
    assert given.settings["num_processes"] == Setting(2, "recipe")


def test_an_nvme_path_in_a_recipe_with_nothing_on_nvme_is_a_warning_and_used_once_something_is(tmp_path: Path) -> None:
    """A recipe may keep nvme_path for the runs that offload to it: a warning, not a refusal (the flag is refused)."""
    (tmp_path / "nvme").mkdir()
    path = recipe(tmp_path, f"nvme_path: {tmp_path / 'nvme'}\noutput_dir: {tmp_path / 'out'}\n")
    run = resolve(RunRequest("rloo", path), cwd=tmp_path, cuda=False)
    assert [note for note in run.notes if "nvme_path" in note] == [
        f"warning: `nvme_path: {tmp_path / 'nvme'}` ({path}:5): nothing is offloaded to nvme, so it would "
        "change nothing; add --offload-optimizer nvme or --offload-params nvme to use it"]
    run = resolve(RunRequest("rloo", path, flags={"offload_optimizer": ("--offload-optimizer", "nvme")}),
                  cwd=tmp_path, cuda=False)
    assert not [note for note in run.notes if "nvme_path" in note]
    assert run.accelerate["deepspeed_config"]["offload_optimizer_nvme_path"] == str(tmp_path / "nvme")
