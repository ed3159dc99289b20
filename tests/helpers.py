"""What many test files share: the repo's paths, writing a file, and launching `rlhf` as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
FIXTURES = REPO / "tests" / "fixtures"
# ZeRO-3's buckets and live-parameter limit sized for the tiny smoke models, so that 2 CPU ranks really fetch and
# release parameters module by module (the defaults would hold a whole tiny model at once).
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


COMMIT = "a" * 40  # the hub cache's commit of the model configs tests put there


def cache_model(repo_id: str, fixture: str, commit: str = COMMIT, ref: str = "main") -> Path:
    """Put a fixture's config.json (tests/fixtures/models) into the hub cache of this test's HF_HOME, as
    `hf download` lays it out."""
    repo = Path(os.environ["HF_HOME"]) / "hub" / f"models--{repo_id.replace('/', '--')}"
    write(repo / "refs" / ref, commit)
    config = (FIXTURES / "models" / fixture / "config.json").read_text()
    return write(repo / "snapshots" / commit / "config.json", config)
