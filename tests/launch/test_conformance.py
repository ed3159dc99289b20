"""Model-family conformance: every algorithm trains every family's stand-in for 2 steps under ZeRO-3, 2 processes.

The stand-ins (tests/families/build.py) carry what real checkpoints of each family expose: no pad token,
pad == EOS risks, several EOS ids, a sampling generation config, BOS added, dropout, tied embeddings,
sliding windows. Each family is also its own reward model, a causal LM given a new score head, as the seed's
pythia-70m is. Every run checks: the run finishes, every logged number is finite, the terminal holds rlhf's own
lines only (what the libraries print is in the ranks' logs) with a line per phase before the first step, every
rank generated as the gather mode asked (the probe's share of the policy gathered), and the saved model and
tokenizer load with `from_pretrained`, have been trained and produce finite logits; for PPO, the ranks sampled
differently.

LoRA (`--lora --merge-adapter`) in PPO's no-gather runs and in the pythia and Qwen2.5 runs of the other algorithms
(one gathering, one not, for each): the reference is the policy with its adapters off, so the KL of the first step
is exactly 0 and not of the last; the adapter loads on the base resized to the saved tokenizer (GPT-2, Llama 3 and
Mistral get a pad row) and the merged model loads by itself and computes the same.

The default run trains every family x algorithm once, gathering or not in turn, so that every algorithm and
every family runs in both modes (24 runs); `pytest -m conformance` runs the whole matrix, each pair in both
modes (48). Chat-message prompts in one of the two modes of every pair whose family has a chat template, plain
text in the other, arranged so that the default half gives each algorithm chat and plain prompts in both modes.
pythia and GPT-2 have no chat template, as their real checkpoints. Every algorithm in the registry
(rlhf_cli/algorithms) runs, from its smoke recipe: a new one is covered once registered.

One RLOO case runs as two machines on this host, one rank each (TWO_MACHINES): the conformance checks read machine
0's terminal, and test_two_machines_on_one_host_train_together reads the same run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest
from families.build import FAMILIES

from helpers import FIXTURES, RECIPES, SMALL_BUCKETS, free_port, rlhf_argv, sets
from rlhf_cli.algorithms import ALGORITHMS
from rlhf_cli.algorithms.spec import Algorithm
from rlhf_cli.output.run_dir import PROBE_CUDA_MEMORY_ENV, PROBE_GENERATION_ENV

UNTRAINED_HEAD = "loaded as a sequence classifier whose score head starts untrained"
# What libraries print on a run; it goes to each rank's log (ranks/rank-N.log), on the terminal only with -v.
THIRD_PARTY = ("No CUDA runtime is found", "cpp_extension", "deepspeed_shm_comm_op", "built successfully",
               "Generating train split", "Writing model shards", "Map:", "[INFO]", "[WARNING]", "UserWarning")
PHASES = ["importing torch, transformers, TRL and DeepSpeed", "loading the models", "building the DeepSpeed engine",
          "generating the first completions"]
KL = {"ppo": "objective/kl", "rloo": "kl", "grpo": "kl", "online_dpo": "objective/kl"}


# 2 updates of 2 x 2 rollouts per process, in 2 generation chunks and 2 mini-batches (one optimizer step each)
PPO_RUN = ("--set", "total_episodes=16", "--set", "num_mini_batches=2", "--set", "local_rollout_forward_batch_size=2",
           "--set", "num_ppo_epochs=1")


def short_run(entry: Algorithm) -> tuple[str, ...]:
    """Flags that make the algorithm's smoke recipe a run of 2 steps with 8-token completions."""
    steps = PPO_RUN if entry.name == "ppo" else ("--max-steps", "2")
    return (*steps, "--set", f"{entry.completion_field}=8")


def losses(entry: Algorithm) -> list[str]:
    """The loss metrics among the algorithm's headline numbers (PPO: policy and value loss)."""
    return [metric for metric, label in entry.headline_metrics if "loss" in label]


MODES = ("gather", "no-gather")


def in_default_run(family_index: int, algorithm_index: int, mode: str) -> bool:
    """Half the matrix: gather and no-gather alternate over families and over algorithms."""
    return MODES.index(mode) == (family_index + algorithm_index) % 2


def prompt_kind(family_index: int, algorithm_index: int, mode: str) -> str:
    """Chat in one mode of each pair; within the default half, chat and plain prompts alternate in pairs of
    families, so that each algorithm gets both kinds in both modes."""
    if FAMILIES[list(FAMILIES)[family_index]].chat_template is None:
        return "plain"
    flip = not in_default_run(family_index, algorithm_index, mode)
    return "chat" if (algorithm_index + family_index // 2 + flip) % 2 == 0 else "plain"


# The other algorithms' LoRA families: in the default run one gathers, the other not. Neither has dropout: TRL's
# trainers keep it on (`disable_dropout` false), and with it the reference pass (adapters off, the same module)
# draws other masks, so GPT-2's first KL is not 0 (PPO turns dropout off, as TRL 1.12's PPO did).
TRL_LORA_FAMILIES = ("pythia", "qwen2.5")


def with_lora(entry: Algorithm, family_index: int, mode: str) -> bool:
    """PPO's no-gather runs; the other algorithms' runs on TRL_LORA_FAMILIES."""
    return mode == "no-gather" if entry.name == "ppo" else list(FAMILIES)[family_index] in TRL_LORA_FAMILIES


def case_id(entry: Algorithm, family: str, mode: str, kind: str, lora: bool) -> str:
    return f"{entry.command}-{family}-{mode}-{kind}{'-lora' if lora else ''}"


# In the default run; no LoRA, so that nothing follows the ranks on machine 0 alone.
TWO_MACHINES = "rloo-gemma-gather-plain"
# Its run is read by test_two_machines_on_one_host_train_together too: both on one worker (tests/conftest.py).
ON_TWO_MACHINES = pytest.mark.xdist_group("two-machines")


def case_marks(family_index: int, algorithm_index: int, mode: str, case: str) -> list[pytest.MarkDecorator]:
    return [*(() if in_default_run(family_index, algorithm_index, mode) else [pytest.mark.full_matrix]),
            *([ON_TWO_MACHINES] if case == TWO_MACHINES else [])]


CASES = [pytest.param(entry, family, mode, prompt_kind(f, a, mode), with_lora(entry, f, mode),
                      id=case_id(entry, family, mode, prompt_kind(f, a, mode), with_lora(entry, f, mode)),
                      marks=case_marks(f, a, mode, case_id(entry, family, mode, prompt_kind(f, a, mode),
                                                           with_lora(entry, f, mode))))
         for a, entry in enumerate(ALGORITHMS.values()) for f, family in enumerate(FAMILIES) for mode in MODES]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The smoke prompts as plain text, and the same as one-message chats."""
    plain = RECIPES / "smoke" / "prompts.jsonl"
    chat = tmp_path_factory.mktemp("prompts") / "chat.jsonl"
    chat.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": json.loads(line)["prompt"]}]}) + "\n"
                            for line in plain.read_text().splitlines()))
    return {"plain": plain, "chat": chat}


def finite_numbers(entry: dict) -> bool:
    return all(math.isfinite(value) for value in entry.values() if isinstance(value, float))


def agreement(samples: list[list[int]], others: list[list[int]]) -> float:
    """Share of positions where two ranks sampled the same token, response by response (a generation chunk
    that stopped early is shorter)."""
    pairs = [(a, b) for ids, other in zip(samples, others, strict=True) for a, b in zip(ids, other, strict=False)]
    return sum(a == b for a, b in pairs) / len(pairs)


def assert_terminal_holds_rlhfs_lines_and_phases(done, out: Path) -> None:
    """What the libraries printed is in the ranks' logs; before the first step, a line per phase."""
    shown = (done.stdout + done.stderr).splitlines()
    assert [line for line in shown if any(mark in line for mark in THIRD_PARTY)] == []
    assert any(mark in (out / "ranks" / "rank-1.log").read_text() for mark in THIRD_PARTY)
    lines = done.stdout.splitlines()
    before_first_step = lines[:next(index for index, line in enumerate(lines) if line.startswith("step 1/2"))]
    assert [line.split("  elapsed ")[0] for line in before_first_step if "  elapsed " in line] == PHASES


def assert_generated_as_asked(record: dict, mode: str) -> None:
    """The trainer got the gather mode asked for and generated accordingly (the probe counts what was gathered);
    the phase probe saw the same calls (no CUDA here: their times only), one after the other."""
    assert record["world_size"] == 2 and record["ds3_gather_for_generation"] is (mode == "gather")
    probe = record["generation_probe"]
    assert probe["calls"] >= 2
    if mode == "gather":
        assert probe["peak_fraction"] == 1.0  # the whole policy was gathered to generate
    else:
        assert probe["peak_fraction"] < 0.6  # generation only ever held a part of it
    phases = record["phase_memory"]
    assert phases["cuda"] is False and phases["phases"] == {}
    starts = [call["started_s"] for call in phases["generation_calls"]]
    assert len(starts) == probe["calls"] and starts == sorted(starts)


def assert_saved_model_loads_and_was_trained(out: Path, model: Path, lora: bool) -> None:
    """A LoRA run saved an adapter that loads on the base resized to the saved tokenizer, and a merged model that
    loads by itself and computes the same; the model (merged or whole) differs from the start and is finite."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("Describe the big tree.", return_tensors="pt")
    if lora:
        from peft import PeftModel

        from rlhf_cli.rank.lora import load_base

        assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
        adapted = PeftModel.from_pretrained(load_base(str(model), tokenizer), out)
        merged = AutoModelForCausalLM.from_pretrained(out / "merged")
        assert torch.allclose(adapted(**ids).logits, merged(**ids).logits, atol=1e-4)
        out = out / "merged"
    trained = AutoModelForCausalLM.from_pretrained(out)
    assert len(tokenizer) <= trained.config.vocab_size
    assert torch.isfinite(trained(**ids).logits).all()
    initial = AutoModelForCausalLM.from_pretrained(model).state_dict()
    assert any(not weight.equal(initial[name]) for name, weight in trained.state_dict().items()
               if name in initial and weight.shape == initial[name].shape)


class Launched(NamedTuple):
    done: subprocess.CompletedProcess  # machine 0's, where the case ran on two
    out: Path
    samples: Path
    machines: list[subprocess.CompletedProcess]  # each machine's; one where the case ran on one


def on_two_machines(argv: list[str], env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """`argv` as two machines of one process each on this host (machine 1 quiet), run to their end."""
    port = str(free_port())
    machines = [subprocess.Popen([*argv, "--num-machines", "2", "--num-processes", "2", "--machine-rank", str(rank),
                                  "--main-process-ip", "127.0.0.1", "--main-process-port", port,
                                  *(["--quiet"] if rank else [])],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
                for rank in (0, 1)]
    done = [subprocess.CompletedProcess(machine.args, 0, *machine.communicate(timeout=480)) for machine in machines]
    for machine, finished in zip(machines, done, strict=True):
        finished.returncode = machine.returncode
        print(finished.stdout[-4000:], finished.stderr[-8000:], sep="\n")
    return done


def launch_case(entry: Algorithm, family: str, mode: str, kind: str, lora: bool, model: Path, prompts: Path,
                folder: Path) -> Launched:
    """The case's run, 2 steps, its reward function keeping every rank's samples; on two machines if it is
    TWO_MACHINES."""
    out, samples = folder / "run", folder / "samples"
    samples.mkdir()
    kl = ["beta=0.05"] if entry.name == "grpo" and lora else []  # GRPO computes no KL at its default beta 0
    argv = rlhf_argv(entry.command, out, f"--{mode}", "--model", str(model), "--reward-model", str(model),
                     "--dataset", str(prompts), *short_run(entry),
                     *sets(f"reward_funcs=[{FIXTURES}/rewards.py:record_samples]", *SMALL_BUCKETS, *kl),
                     *(["--lora", "--merge-adapter"] if lora else []), recipe=RECIPES / entry.name / "smoke.yaml")
    env = {"RLHF_TEST_SAMPLES": str(samples), PROBE_GENERATION_ENV: "1", PROBE_CUDA_MEMORY_ENV: "1"}
    if case_id(entry, family, mode, kind, lora) == TWO_MACHINES:
        machines = on_two_machines(argv, env)
    else:
        machines = [subprocess.run(argv, capture_output=True, text=True, timeout=480, env={**os.environ, **env})]
        print(machines[0].stdout[-4000:], machines[0].stderr[-8000:], sep="\n")
    return Launched(machines[0], out, samples, machines)


@pytest.fixture
def case_run(family_models: dict[str, Path], prompts: dict[str, Path], shared_runs):
    """A case's run, launched once per session whichever test asks first."""

    def launched(entry: Algorithm, family: str, mode: str, kind: str, lora: bool) -> Launched:
        return shared_runs.get(("conformance", case_id(entry, family, mode, kind, lora)), lambda folder: launch_case(
            entry, family, mode, kind, lora, family_models[family], prompts[kind], folder))

    return launched


@pytest.mark.conformance
@pytest.mark.parametrize(("entry", "family", "mode", "kind", "lora"), CASES)
def test_family_trains(entry: Algorithm, family: str, mode: str, kind: str, lora: bool, family_models: dict[str, Path],
                       case_run) -> None:
    model = family_models[family]
    done, out, samples, _ = case_run(entry, family, mode, kind, lora)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "Traceback" not in done.stderr and UNTRAINED_HEAD in done.stderr
    assert_terminal_holds_rlhfs_lines_and_phases(done, out)

    state = json.loads((out / "trainer_state.json").read_text())
    steps = [log for log in state["log_history"] if all(loss in log for loss in losses(entry))]
    assert state["global_step"] == 2 and len(steps) == 2
    assert all(finite_numbers(log) for log in steps), steps
    if lora:  # the reference is the policy with its adapters off
        assert steps[0][KL[entry.name]] == 0.0 and steps[-1][KL[entry.name]] != 0.0, steps
    for rank in (0, 1):
        assert_generated_as_asked(json.loads((out / "ranks" / f"rank-{rank}.json").read_text()), mode)
    assert_saved_model_loads_and_was_trained(out, model, lora)

    per_rank = [[ids for line in (samples / f"rank-{rank}.jsonl").read_text().splitlines()
                 for ids in json.loads(line)] for rank in (0, 1)]
    assert per_rank[0] and per_rank[1]
    if entry.name == "ppo":  # one seed on every rank made random models agree on 91% of tokens
        assert agreement(*per_rank) < 0.5


@ON_TWO_MACHINES
def test_two_machines_on_one_host_train_together(case_run) -> None:
    """TWO_MACHINES's run: two launchers on this host, one rank each, machine 1 quiet."""
    [case] = [case.values for case in CASES if case.id == TWO_MACHINES]
    _, out, _, machines = case_run(*case)
    (code0, said0), (code1, said1) = ((machine.returncode, machine.stderr) for machine in machines)
    assert code0 == code1 == 0
    assert "run finished" in said0 and "rlhf rloo" in said0  # the summary and the header
    assert "run finished" not in said1 and "rlhf rloo" not in said1 and "Warning" not in said1  # --quiet
    records = [json.loads((out / "ranks" / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert [(r["rank"], r["machine_rank"], r["local_rank"], r["world_size"]) for r in records] == \
        [(0, 0, 0, 2), (1, 1, 0, 2)]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
    assert (out / "machines" / "machine-1" / "launch.sh").is_file() and (out / "launch.sh").is_file()
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "finished" and run["layout"]["num_machines"] == 2
    assert {"python", "torch", "transformers", "trl", "deepspeed", "accelerate"} <= run["versions"].keys()
    assert [rank["hostname"] for rank in run["ranks"]] == [os.uname().nodename] * 2
