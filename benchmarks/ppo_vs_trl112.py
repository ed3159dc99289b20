"""rlhf's PPO beside TRL 1.12's PPOTrainer on the same task, with TRL 1.12's own batch settings.

TRL 1.12 runs from a side environment (TRL deleted its PPOTrainer in 1.13):

    python -m venv ../venv-trl112 --system-site-packages && ../venv-trl112/bin/pip install trl==1.12.0 --no-deps
    python benchmarks/ppo_vs_trl112.py [--updates 40] [--seeds 42 43 44] [--trl-python ../venv-trl112/bin/python]

Both train the smoke policy (recipes/smoke/policy) on the smoke prompts for `--updates` updates of 8 rollouts per
process (per_device_train_batch_size 8, gradient_accumulation_steps 1, num_mini_batches 2, num_ppo_epochs 4), one
process each on the CPU, on the hand-set reward of benchmarks/trl112_task.py (TRL 1.12 takes a reward model, so its
`get_reward` is given the same function for the reward model). `rlhf ppo` gets the settings as `--set` pairs,
unchanged. Score gain: the mean score of the last 5 updates minus that of the first 5; seconds per update: the
median time between consecutive reward calls (one per update).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from trl112_task import LOG_ENV, POLICY, RESPONSE_LENGTH  # noqa: E402

REPO = HERE.parent
PROMPTS = REPO / "recipes" / "smoke" / "prompts.jsonl"
SETTINGS = {  # TRL 1.12's own batch settings, and a learning task the smoke policy can learn
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_mini_batches": 2, "num_ppo_epochs": 4,
    "local_rollout_forward_batch_size": 8, "response_length": RESPONSE_LENGTH, "stop_token": "eos",
    "temperature": 1.0, "kl_coef": 0.0, "missing_eos_penalty": None,
    "gradient_checkpointing": False, "logging_steps": 1, "save_strategy": "no", "report_to": "none", "bf16": False,
}
WINDOW = 5
# The learning rate: at 1e-2 both trainers reach a score near 1.0 by update 16, where the task no longer ranks them;
# at this one neither saturates within the default updates.
LEARNING_RATE = 2e-3
# The two sides compared like for like: TRL 1.12's loop never clips gradients; rlhf's PPO clips at max_grad_norm
# (1.0 by default, through DeepSpeed's gradient_clipping), and 0 turns clipping off, as in transformers.
RLHF_MAX_GRAD_NORMS = (0.0, 1.0)


def trl_worker(out: Path, seed: int, updates: int, learning_rate: float) -> None:
    """TRL 1.12's PPOTrainer in this process (run with the side environment's Python)."""
    import torch
    import torch.nn as nn
    import trl.experimental.ppo.ppo_trainer as ppo_module
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl112_task import note_call, score

    class HandSetReward(nn.Module):
        """Stands for the reward model; `get_reward` scores it with the hand-set function."""

        def __init__(self) -> None:
            super().__init__()
            self.unused = nn.Parameter(torch.zeros(1))

    original = ppo_module.get_reward

    def get_reward(model, query_responses, pad_token_id, context_length):
        if not isinstance(model, HandSetReward):
            return original(model, query_responses, pad_token_id, context_length)
        note_call()
        responses = query_responses[:, context_length:].tolist()
        own = [row[:row.index(pad_token_id)] if pad_token_id in row else row for row in responses]
        return None, torch.tensor([score(ids) for ids in own], device=query_responses.device), None

    ppo_module.get_reward = get_reward
    tokenizer = AutoTokenizer.from_pretrained(POLICY, padding_side="left")
    dataset = load_dataset("json", data_files=str(PROMPTS), split="train")
    dataset = dataset.map(lambda row: {"input_ids": tokenizer(row["prompt"]).input_ids},
                          remove_columns=dataset.column_names)
    values = {**SETTINGS, "total_episodes": updates * SETTINGS["per_device_train_batch_size"],
              "learning_rate": learning_rate}
    args = PPOConfig(output_dir=str(out), seed=seed, use_cpu=True, num_sample_generations=0, **values)
    trainer = PPOTrainer(args=args, processing_class=tokenizer, model=AutoModelForCausalLM.from_pretrained(POLICY),
                         ref_model=AutoModelForCausalLM.from_pretrained(POLICY), reward_model=HandSetReward(),
                         value_model=AutoModelForSequenceClassification.from_pretrained(POLICY, num_labels=1),
                         train_dataset=dataset, eval_dataset=dataset)
    trainer.train()
    scores = [entry["objective/scores"] for entry in trainer.state.log_history if "objective/scores" in entry]
    (out / "scores.json").write_text(json.dumps(scores))


def run_trl(python: str, out: Path, seed: int, updates: int, learning_rate: float) -> list[float]:
    # One thread, as rlhf's launcher starts its ranks (OMP_NUM_THREADS=1): on a busy machine two threads per op
    # spend most of an update waiting for each other, which would time the machine, not the trainer.
    env = {"OMP_NUM_THREADS": "1", **os.environ, LOG_ENV: str(out / "calls.log"), "TRL_EXPERIMENTAL_SILENCE": "1"}
    subprocess.run([python, __file__, "--trl-worker", str(out), str(seed), str(updates), str(learning_rate)],
                   check=True, env=env, capture_output=True, text=True)
    return json.loads((out / "scores.json").read_text())


def run_rlhf(out: Path, seed: int, updates: int, learning_rate: float, max_grad_norm: float) -> list[float]:
    values = {**SETTINGS, "total_episodes": updates * SETTINGS["per_device_train_batch_size"], "seed": seed,
              "learning_rate": learning_rate, "max_grad_norm": max_grad_norm,
              "num_processes": 1, "reward_model_name_or_path": None, "dataset_name": str(PROMPTS),
              "reward_funcs": f"[{HERE / 'trl112_task.py'}:hand_set_reward]"}
    argv = [sys.executable, "-m", "rlhf_cli", "ppo", "--model", str(POLICY), "-o", str(out / "run")]
    for key, value in values.items():
        argv += ["--set", f"{key}={as_yaml(value)}"]
    done = subprocess.run(argv, env={**os.environ, LOG_ENV: str(out / "calls.log")}, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"rlhf ppo failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    state = json.loads((out / "run" / "trainer_state.json").read_text())
    return [entry["objective/scores"] for entry in state["log_history"] if "objective/scores" in entry]


def as_yaml(value: object) -> str:
    """A --set value as YAML reads it back: null, true/false, numbers, and strings quoted (`no` is not false)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return f"'{value}'" if isinstance(value, str) and not value.startswith("[") else str(value)


def seconds_per_update(log: Path) -> float:
    times = [float(line) for line in log.read_text().split()]
    return statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


def gain(scores: list[float]) -> float:
    window = min(WINDOW, len(scores) // 2)
    return statistics.mean(scores[-window:]) - statistics.mean(scores[:window])


def area(scores: list[float]) -> float:
    """The area under the score curve per update (the mean score over every update): what ranks two trainers
    that both learn, where the gain ties once both saturate."""
    return statistics.mean(scores)


def trainers(options: argparse.Namespace) -> dict[str, Callable[[Path, int], list[float]]]:
    """Each side by name: TRL 1.12, and rlhf at each max_grad_norm."""
    found: dict[str, Callable[[Path, int], list[float]]] = {
        "TRL 1.12 PPOTrainer (never clips)": lambda out, seed: run_trl(options.trl_python, out, seed, options.updates,
                                                                       options.learning_rate)}
    for norm in RLHF_MAX_GRAD_NORMS:
        name = f"rlhf ppo, max_grad_norm {norm:g}" + (" (no clipping)" if norm == 0 else "")
        found[name] = lambda out, seed, norm=norm: run_rlhf(out, seed, options.updates, options.learning_rate, norm)
    return {name: run for name, run in found.items() if not options.only or name.lower().startswith(options.only)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--learning-rate", type=float, default=LEARNING_RATE)
    parser.add_argument("--trl-python", default=str(REPO.parent / "venv-trl112" / "bin" / "python"))
    parser.add_argument("--only", choices=["trl", "rlhf"], help="run one of the two")
    parser.add_argument("--work-dir", type=Path, help="keep each run's files (scores.json, calls.log) here")
    parser.add_argument("--trl-worker", nargs=4, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.trl_worker:
        out, seed, updates, learning_rate = options.trl_worker
        trl_worker(Path(out), int(seed), int(updates), float(learning_rate))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="ppo-vs-trl112-") as scratch:
        work = options.work_dir or Path(scratch)
        for seed in options.seeds:  # interleaved: every trainer on a seed before the next seed
            for index, (name, run) in enumerate(trainers(options).items()):
                out = Path(work) / f"{index}-{seed}"
                out.mkdir(parents=True)
                scores = run(out, seed)
                (out / "scores.json").write_text(json.dumps(scores))
                rows.append((name, seed, len(scores), area(scores), gain(scores),
                             seconds_per_update(out / "calls.log")))
                print(f"{name:40} seed {seed}: {len(scores)} updates, score {scores[0]:.3f} -> {scores[-1]:.3f}, "
                      f"area {rows[-1][3]:.3f}, gain {rows[-1][4]:+.3f}, {rows[-1][5]:.2f} s/update", flush=True)
    print(f"\nlearning_rate {options.learning_rate:g}, {options.updates} updates")
    print(f"| trainer | seed | updates | area under the score curve (mean score) | score gain (last {WINDOW} - first "
          f"{WINDOW}) | seconds per update |")
    print("|---|---|---|---|---|---|")
    for name, seed, updates, score_area, score_gain, seconds in rows:
        print(f"| {name} | {seed} | {updates} | {score_area:.3f} | {score_gain:+.3f} | {seconds:.2f} |")
    for name in dict.fromkeys(row[0] for row in rows):
        mine = [row for row in rows if row[0] == name]
        areas = [row[3] for row in mine]
        spread = f" (min {min(areas):.3f}, max {max(areas):.3f})" if len(areas) > 1 else ""
        print(f"| {name} | median of {len(mine)} | | {statistics.median(areas):.3f}{spread} | "
              f"{statistics.median(r[4] for r in mine):+.3f} | {statistics.median(r[5] for r in mine):.2f} |")


if __name__ == "__main__":
    main()
