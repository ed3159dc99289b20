"""Model families with `--vllm colocate` under every gather choice, most of which no launched vLLM test trains: each
trains 2 steps of GRPO (2 CPU processes under ZeRO-3, its weights synced into vLLM after each update) or is refused
before launch with the reason; a run that crashes is a bug.

Each family is a tiny random-weight stand-in of its public `config.json` (tests/families/build.py, with the heads
vLLM's CPU attention runs), trained by `rlhf grpo -r recipes/grpo/smoke.yaml --model DIR --vllm colocate` (the
smoke reward model scores the decoded completions: not every family has a sequence-classification class), in bf16
by default (a bf16 generator lets the syncs after the first go sparse), under `--gather`, `--gather-budget 0.5`
and `--no-gather`. What a run records is read back (`vllm_sync` in ranks/rank-N.json): per sync dense or sparse
and the bytes sent, and the logprob self-check's largest difference (over its checks after the first sync and
the first update). A run refused before launch exits 2 with one `Error:` line, which the table quotes. A family
refused under colocate with the advice to generate with `--vllm server` then follows it as a user would: `rlhf
vllm-serve grpo` on the same recipe, stand-in and dtype, and the same 2 steps with `--vllm server --gather`
(one gather choice: it only bounds the sync's buckets), a row of its own ("server (gather)"); the server is stopped
after its family's run. Needs vLLM (its CPU build: VLLM_CPU_KVCACHE_SPACE=1):

    python benchmarks/families_vllm.py [--families granite olmo2 ...] [--gathers gather budget no-gather]
        [--dtype bf16|fp32] [--learning-rate 1e-6] [--fresh] [--report-only] [--out benchmarks/results]

Runs are kept in the work folder: a later call adds families or gather choices, and the table covers every
finished run (`--fresh` starts over).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from _common import (
    REPO,
    RESULTS,
    VLLM_ENV,
    WORK,
    CommandFailed,
    markdown_table,
    print_table,
    python_module,
    run_timed,
    vllm_server,
    write_markdown,
)

sys.path.insert(0, str(REPO / "tests"))
from families.build import EVERY_FAMILY, build_family  # noqa: E402  (the tests' stand-ins)

RECIPE = REPO / "recipes" / "grpo" / "smoke.yaml"
GATHERS = {"gather": ("--gather",), "budget": ("--gather-budget", "0.5"), "no-gather": ("--no-gather",)}
SERVED = "server (gather)"  # the row of a family trained through `rlhf vllm-serve`, under --gather
ADVICE = "--vllm server"  # what a colocate refusal names when a server would run the family
# The launched tests' ZeRO-3 buckets: small enough that a budget and no-gather sync a unit at a time
SMALL_BUCKETS = ("stage3_prefetch_bucket_size=2000", "stage3_param_persistence_threshold=0",
                 "stage3_max_live_parameters=20000")
DEFAULT_FAMILIES = ["granite", "olmo2", "smollm3", "cohere", "stablelm", "mistral", "gemma", "llama3", "pythia", "gpt2",
                    "qwen2.5"]
COLUMNS = ["family", "gather", "exit", "outcome", "self-check max /Δ logp/", "syncs (dense/sparse)",
           "bytes sent of dense, per sync", "seconds"]


@dataclass(frozen=True)
class Outcome:
    family: str
    gather: str
    returncode: int
    seconds: float
    output: str  # stdout and stderr's last characters


def dtype_sets(dtype: str) -> tuple[str, ...]:
    return ("bf16=true",) if dtype == "bf16" else ()


def run_flags(model: Path, dtype: str, rate: str, vllm: tuple[str, ...]) -> list[str]:
    """The 2-step run's flags; `vllm` says how it generates and under which gather choice."""
    sets = [*SMALL_BUCKETS, f"learning_rate={rate}", *dtype_sets(dtype)]
    return ["-r", str(RECIPE), "--model", str(model), *vllm, "--max-steps", "2",
            *[part for pair in sets for part in ("--set", pair)]]


def stand_in(family: str, work: Path) -> Path:
    """The family's stand-in, built once."""
    model = work / "models" / family
    if not (model / "config.json").is_file():
        build_family(family, model, vllm=True)
    return model


def run_folder(work: Path, family: str, gather: str) -> Path:
    return work / "runs" / f"{family}-{re.sub(r'[^a-z0-9.]+', '-', gather).strip('-')}"


def record(out: Path, family: str, gather: str, returncode: int, seconds: float, output: str) -> None:
    """The run's exit code, seconds and output's tail (outcome.json), read back by `report`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "outcome.json").write_text(json.dumps({"family": family, "gather": gather, "returncode": returncode,
                                                  "seconds": seconds, "output": output[-4000:]}))


def train(family: str, gather: str, flags: list[str], work: Path) -> None:
    """Train the 2 steps with `flags` into the run's folder, its outcome recorded whatever it was."""
    out = run_folder(work, family, gather)
    shutil.rmtree(out, ignore_errors=True)
    argv = python_module("rlhf_cli", "grpo", *flags, "-o", str(out), "--overwrite")
    try:
        timed = run_timed(argv, env=VLLM_ENV, timeout=1200)
        returncode, seconds, output = 0, timed.seconds, timed.output
    except CommandFailed as failed:
        found = re.search(r" exited (-?\d+):", str(failed))
        returncode, seconds, output = (int(found.group(1)) if found else -1), float("nan"), str(failed)
    record(out, family, gather, returncode, seconds, output)


def run_one(family: str, gather: str, dtype: str, rate: str, work: Path) -> None:
    """Train the family's stand-in colocated under one gather choice (or record its refusal)."""
    model = stand_in(family, work)
    train(family, gather, run_flags(model, dtype, rate, ("--vllm", "colocate", *GATHERS[gather])), work)


def advised_server(family: str, work: Path) -> bool:
    """Whether a colocated run of the family was refused with the advice to generate with a vLLM server."""
    for path in sorted((work / "runs").glob(f"{family}-*/outcome.json")):
        outcome = Outcome(**json.loads(path.read_text()))
        colocated = outcome.family == family and outcome.gather in GATHERS
        if colocated and outcome.returncode == 2 and ADVICE in refusal(outcome.output, str(work / "models" / family)):
            return True
    return False


def run_served(family: str, dtype: str, rate: str, work: Path) -> None:
    """Follow the refusal's advice: serve the stand-in with `rlhf vllm-serve grpo` (same recipe and dtype), train
    the 2 steps against it under --gather, stop it. A server that never answers is recorded as the run's crash."""
    model = stand_in(family, work)
    log = work / "servers" / f"{family}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    serve = ["grpo", "-r", str(RECIPE), "--model", str(model), *[p for s in dtype_sets(dtype) for p in ("--set", s)]]
    try:
        with vllm_server(log, *serve) as url:
            vllm = ("--vllm", "server", "--gather", "--set", f"vllm_server_base_url={url}")
            train(family, SERVED, run_flags(model, dtype, rate, vllm), work)
    except RuntimeError as failed:
        record(run_folder(work, family, SERVED), family, SERVED, -1, float("nan"), str(failed))


def refusal(output: str, model: str) -> str:
    """The one-line error a refused run printed (the stand-in's folder named by its family), or ''."""
    lines = [line for line in output.splitlines() if line.startswith("Error:")]
    return lines[-1].replace(model, "the stand-in") if lines else ""


def row(outcome: Outcome, run: Path) -> list[str]:
    """The table's row of one run: what its ranks recorded, or why it never trained."""
    records = [json.loads(path.read_text()) for path in sorted((run / "ranks").glob("rank-*.json"))
               if re.fullmatch(r"rank-\d+\.json", path.name)]
    syncs = records[0].get("vllm_sync", []) if records else []
    checks = [sync["check_logp_difference_max"] for record in records for sync in record.get("vllm_sync", [])
              if "check_logp_difference_max" in sync]
    if outcome.returncode == 0:
        what = "trained 2 steps"
    elif outcome.returncode == 2 and not records:
        model = str(run.parent.parent / "models" / outcome.family)
        what = "refused before launch: " + refusal(outcome.output, model).removeprefix("Error: ")
    else:
        tail = [line for line in outcome.output.splitlines() if line.strip()][-3:]
        what = "CRASHED: " + " / ".join(tail)
    modes = f"{sum(s['mode'] == 'dense' for s in syncs)}/{sum(s['mode'] == 'sparse' for s in syncs)}" if syncs else ""
    sent = "; ".join(f"{s['bytes_sent']:,} of {s['dense_bytes']:,}" + (
        f" ({s['changed_share']:.2%} changed)" if s.get("changed_share") is not None else "") for s in syncs)
    return [outcome.family, outcome.gather, str(outcome.returncode), what.replace("|", "/"),
            f"{max(checks):.2e}" if checks else "", modes, sent,
            f"{outcome.seconds:.0f}" if outcome.seconds == outcome.seconds else ""]


def report(work: Path, out: Path, dtype: str, rate: str) -> None:
    """Print and write the table of every finished run (rewritten after every run)."""
    found = []
    for path in sorted((work / "runs").glob("*/outcome.json")):
        outcome = Outcome(**json.loads(path.read_text()))
        found.append((outcome, path.parent))
    order = list(EVERY_FAMILY)
    found.sort(key=lambda item: (order.index(item[0].family), [*GATHERS, SERVED].index(item[0].gather)))
    rows = [row(outcome, run) for outcome, run in found]
    title = (f"GRPO, 2 steps, --vllm colocate (a refused family also --vllm server), {dtype}, learning rate {rate}, "
             "2 CPU processes under ZeRO-3, on stand-ins of real families (tests/families/build.py)")
    print_table(title, COLUMNS, rows)
    note = ("A sync's bytes are all ranks' together, from rank 0's record (the first sync is dense; in bf16 a later "
            "one sends only what changed, a partition of which too much changed whole). The self-check compares "
            "vLLM's logprobs with the policy's on a probe after the first sync and the first update: its largest "
            "difference over both, on both ranks. A \"server (gather)\" row is a family refused under colocate, "
            "trained with `--vllm server --gather` against `rlhf vllm-serve grpo` on its stand-in, as the refusal "
            "advises; the logprob self-check runs colocated only, so such a row has none.")
    write_markdown(out / "families_vllm.md", f"# {title}\n\n{markdown_table(COLUMNS, rows)}\n{note}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=DEFAULT_FAMILIES, choices=list(EVERY_FAMILY))
    parser.add_argument("--gathers", nargs="+", default=list(GATHERS), choices=list(GATHERS))
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--learning-rate", default="1e-6", help="an RL one: most bf16 weights keep their bits")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=WORK, help="where the stand-ins and the runs go (not in git)")
    parser.add_argument("--fresh", action="store_true", help="forget the runs of earlier calls")
    parser.add_argument("--report-only", action="store_true", help="write the table of the finished runs, run none")
    args = parser.parse_args()
    work = args.work_dir / "runs" / "families_vllm"
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    if not args.report_only:
        for family in args.families:
            for gather in args.gathers:
                print(f"{family}, {gather} ...", flush=True)
                run_one(family, gather, args.dtype, args.learning_rate, work)
                report(work, args.out, args.dtype, args.learning_rate)
            if advised_server(family, work):
                print(f"{family}, {SERVED} ...", flush=True)
                run_served(family, args.dtype, args.learning_rate, work)
                report(work, args.out, args.dtype, args.learning_rate)
    if args.report_only:
        report(work, args.out, args.dtype, args.learning_rate)


if __name__ == "__main__":
    main()
