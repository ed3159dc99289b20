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
        [--dtype bf16|fp32] [--learning-rate 1e-6] [--lora [--lora-targets default all-linear]] [--fresh]
        [--report-only] [--out benchmarks/results]

`--lora` trains LoRA adapters instead (`--lora`, PEFT's default targets for the family, or `all-linear`), at a
learning rate high enough that the adapters change (1e-4 by default: B starts at zero): a colocated vLLM then
serves the adapters itself (vLLM's LoRA: the base synced once, then only lora_A/lora_B, checked by bit checksums
against what vLLM holds), or holds the policy merged for the reason the run records. Their runs and their table
section are their own.

Runs are kept in the work folder: a later call adds families or gather choices, and the table covers every
finished run (`--fresh` starts over); a section none of whose runs are in the work folder is kept as it was.
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
)

sys.path.insert(0, str(REPO / "tests"))
from families.build import EVERY_FAMILY, build_family  # noqa: E402  (the tests' stand-ins)

RECIPE = REPO / "recipes" / "grpo" / "smoke.yaml"
GATHERS = {"gather": ("--gather",), "budget": ("--gather-budget", "0.5"), "no-gather": ("--no-gather",)}
SERVED = "server (gather)"  # the row of a family trained through `rlhf vllm-serve`, under --gather
ADVICE = "--vllm server"  # what a colocate refusal names when a server would run the family
# LoRA's targets: PEFT's default for the family (no lora_target_modules), or every linear module but the head
LORA_TARGETS = {"default": (), "all-linear": ("--set", "lora_target_modules=[all-linear]")}
RATES = {"": "1e-6", "lora": "1e-4"}  # full fine-tuning's (an RL one) and LoRA's (the adapters must change)
# The launched tests' ZeRO-3 buckets: small enough that a budget and no-gather sync a unit at a time
SMALL_BUCKETS = ("stage3_prefetch_bucket_size=2000", "stage3_param_persistence_threshold=0",
                 "stage3_max_live_parameters=20000")
DEFAULT_FAMILIES = ["granite", "olmo2", "smollm3", "cohere", "stablelm", "phi3", "mistral", "gemma", "llama3", "pythia",
                    "gpt2", "qwen2.5"]
COLUMNS = ["family", "gather", "exit", "outcome", "self-check max /Δ logp/", "syncs (dense/sparse)",
           "bytes sent of dense, per sync", "seconds"]
LORA_COLUMNS = ["family", "targets", "gather", "learning rate", "exit", "outcome", "sync modes",
                "adapter bytes / dense bytes, per sync", "adapter groups verified", "self-check max /Δ logp/",
                "merged because", "seconds"]
# The calls that ran the LoRA section's rows: every family with PEFT's default targets, those PEFT has none for and
# a few more with all-linear, under --no-gather; a few under --gather at a learning rate at which the adapters move
# the logprobs well past the self-check's bf16 noise (at 1e-4 they move them by 1e-5 to 1e-2 in 2 steps)
LORA_CALLS = ("--lora --gathers no-gather",
              "--lora --lora-targets all-linear --families phi3 granite cohere gemma llama3 stablelm olmo2 smollm3 "
              "--gathers no-gather",
              "--lora --families qwen2.5 llama3 --gathers gather --learning-rate 1e-2",
              "--lora --lora-targets all-linear --families phi3 cohere gemma --gathers gather --learning-rate 1e-2")
SECTIONS = {"": "# GRPO, 2 steps, --vllm colocate", "lora": "# LoRA: GRPO, 2 steps, --lora --vllm colocate"}


@dataclass(frozen=True)
class Outcome:
    family: str
    gather: str
    returncode: int
    seconds: float
    output: str  # stdout and stderr's last characters
    lora: str = ""  # LoRA's targets (LORA_TARGETS), "" for full fine-tuning
    rate: str = ""


@dataclass(frozen=True)
class Setting:
    """What every run of one call shares: dtype, learning rate, LoRA's targets ("" for none)."""

    dtype: str
    rate: str
    lora: str = ""

    def flags(self) -> list[str]:
        sets = [*SMALL_BUCKETS, f"learning_rate={self.rate}", *dtype_sets(self.dtype)]
        lora = ["--lora", *LORA_TARGETS[self.lora]] if self.lora else []
        return [*lora, *[part for pair in sets for part in ("--set", pair)]]


def dtype_sets(dtype: str) -> tuple[str, ...]:
    return ("bf16=true",) if dtype == "bf16" else ()


def run_flags(model: Path, setting: Setting, vllm: tuple[str, ...]) -> list[str]:
    """The 2-step run's flags; `vllm` says how it generates and under which gather choice."""
    return ["-r", str(RECIPE), "--model", str(model), *vllm, "--max-steps", "2", *setting.flags()]


def stand_in(family: str, work: Path) -> Path:
    """The family's stand-in, built once."""
    model = work / "models" / family
    if not (model / "config.json").is_file():
        build_family(family, model, vllm=True)
    return model


def run_folder(work: Path, family: str, gather: str, setting: Setting) -> Path:
    """The run's folder: by family and gather choice, and LoRA's targets and a learning rate not its default."""
    label = f"lora {setting.lora} {gather}" if setting.lora else gather
    if setting.lora and setting.rate != RATES["lora"]:
        label += f" lr {setting.rate}"
    return work / "runs" / f"{family}-{re.sub(r'[^a-z0-9.]+', '-', label).strip('-')}"


def record(out: Path, outcome: Outcome) -> None:
    """The run's exit code, seconds and output's tail (outcome.json), read back by `report`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "outcome.json").write_text(json.dumps({**outcome.__dict__, "output": outcome.output[-4000:]}))


def train(family: str, gather: str, flags: list[str], work: Path, setting: Setting) -> None:
    """Train the 2 steps with `flags` into the run's folder, its outcome recorded whatever it was."""
    out = run_folder(work, family, gather, setting)
    shutil.rmtree(out, ignore_errors=True)
    argv = python_module("rlhf_cli", "grpo", *flags, "-o", str(out), "--overwrite")
    try:
        timed = run_timed(argv, env=VLLM_ENV, timeout=1200)
        returncode, seconds, output = 0, timed.seconds, timed.output
    except CommandFailed as failed:
        found = re.search(r" exited (-?\d+):", str(failed))
        returncode, seconds, output = (int(found.group(1)) if found else -1), float("nan"), str(failed)
    record(out, Outcome(family, gather, returncode, seconds, output, setting.lora, setting.rate))


def run_one(family: str, gather: str, setting: Setting, work: Path) -> None:
    """Train the family's stand-in colocated under one gather choice (or record its refusal)."""
    model = stand_in(family, work)
    train(family, gather, run_flags(model, setting, ("--vllm", "colocate", *GATHERS[gather])), work, setting)


def outcomes(work: Path) -> list[tuple[Outcome, Path]]:
    return [(Outcome(**json.loads(path.read_text())), path.parent)
            for path in sorted((work / "runs").glob("*/outcome.json"))]


def advised_server(family: str, work: Path, lora: str) -> bool:
    """Whether a colocated run of the family (with the same LoRA) was refused with the advice to generate with a
    vLLM server."""
    return any(outcome.family == family and outcome.lora == lora and outcome.gather in GATHERS
               and outcome.returncode == 2 and ADVICE in refusal(outcome.output, str(work / "models" / family))
               for outcome, _ in outcomes(work))


def run_served(family: str, setting: Setting, work: Path) -> None:
    """Follow the refusal's advice: serve the stand-in with `rlhf vllm-serve grpo` (same recipe, dtype, LoRA), train
    the 2 steps against it under --gather, stop it. A server that never answers is recorded as the run's crash."""
    model = stand_in(family, work)
    log = work / "servers" / f"{family}{'-lora' if setting.lora else ''}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    lora = ["--lora", *LORA_TARGETS[setting.lora]] if setting.lora else []  # the server serves them where it can
    serve = ["grpo", "-r", str(RECIPE), "--model", str(model), *lora,
             *[p for s in dtype_sets(setting.dtype) for p in ("--set", s)]]
    try:
        with vllm_server(log, *serve) as url:
            vllm = ("--vllm", "server", "--gather", "--set", f"vllm_server_base_url={url}")
            train(family, SERVED, run_flags(model, setting, vllm), work, setting)
    except RuntimeError as failed:
        record(run_folder(work, family, SERVED, setting),
               Outcome(family, SERVED, -1, float("nan"), str(failed), setting.lora, setting.rate))


def refusal(output: str, model: str) -> str:
    """The one-line error a refused run printed (the stand-in's folder named by its family), or ''."""
    lines = [line for line in output.splitlines() if line.startswith("Error:")]
    return lines[-1].replace(model, "the stand-in") if lines else ""


def what_happened(outcome: Outcome, run: Path, records: list[dict]) -> str:
    """Trained, refused before launch (the error line), or crashed (the output's last lines)."""
    if outcome.returncode == 0:
        return "trained 2 steps"
    if outcome.returncode == 2 and not records:
        model = str(run.parent.parent / "models" / outcome.family)
        return "refused before launch: " + refusal(outcome.output, model).removeprefix("Error: ")
    tail = [line for line in outcome.output.splitlines() if line.strip()][-3:]
    return "CRASHED: " + " / ".join(tail)


def rank_records(run: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((run / "ranks").glob("rank-*.json"))
            if re.fullmatch(r"rank-\d+\.json", path.name)]


def largest_check(records: list[dict]) -> str:
    """The logprob self-check's largest difference over every sync of every rank."""
    checks = [sync["check_logp_difference_max"] for record in records for sync in record.get("vllm_sync", [])
              if "check_logp_difference_max" in sync]
    return f"{max(checks):.2e}" if checks else ""


def seconds(outcome: Outcome) -> str:
    return f"{outcome.seconds:.0f}" if outcome.seconds == outcome.seconds else ""


def row(outcome: Outcome, run: Path) -> list[str]:
    """The table's row of one run: what its ranks recorded, or why it never trained."""
    records = rank_records(run)
    syncs = records[0].get("vllm_sync", []) if records else []
    modes = f"{sum(s['mode'] == 'dense' for s in syncs)}/{sum(s['mode'] == 'sparse' for s in syncs)}" if syncs else ""
    sent = "; ".join(f"{s['bytes_sent']:,} of {s['dense_bytes']:,}" + (
        f" ({s['changed_share']:.2%} changed)" if s.get("changed_share") is not None else "") for s in syncs)
    return [outcome.family, outcome.gather, str(outcome.returncode),
            what_happened(outcome, run, records).replace("|", "/"), largest_check(records), modes, sent,
            seconds(outcome)]


def sync_mode(sync: dict) -> str:
    """A sync's mode; the first of vLLM's LoRA sends the base (dense, unmerged) and the adapters."""
    return "base+adapter" if sync["mode"] == "dense" and "adapter_bytes" in sync else sync["mode"]


def lora_row(outcome: Outcome, run: Path) -> list[str]:
    """A LoRA run's row: each sync's mode, the adapters' bytes against the dense policy's, the adapter groups
    checked against what vLLM holds, and why the syncs were merged where they were."""
    records = rank_records(run)
    syncs = records[0].get("vllm_sync", []) if records else []
    sizes = "; ".join((f"{'base + ' if s['mode'] == 'dense' else ''}{s['adapter_bytes']:,} / {s['dense_bytes']:,}"
                       if "adapter_bytes" in s else f"merged {s['bytes_sent']:,} / {s['dense_bytes']:,}")
                      for s in syncs)
    verified = ", ".join(str(s["adapter_groups_verified"]) for s in syncs if "adapter_groups_verified" in s)
    reasons = sorted({s["adapters_merged_reason"] for s in syncs if s.get("adapters_merged_reason")})
    return [outcome.family, outcome.lora, outcome.gather, outcome.rate, str(outcome.returncode),
            what_happened(outcome, run, records).replace("|", "/"), ", ".join(sync_mode(s) for s in syncs), sizes,
            verified, largest_check(records), "; ".join(reasons).replace("|", "/"), seconds(outcome)]


def section(found: list[tuple[Outcome, Path]], lora: str, dtype: str) -> str:
    """The markdown section of full fine-tuning's runs (`lora` "") or LoRA's, with its reproducing command."""
    rates = ", ".join(sorted({outcome.rate or RATES[""] for outcome, _ in found}))
    if lora:
        title = (f"{SECTIONS['lora'][2:]}, {dtype}, learning rate {rates}, 2 CPU processes under ZeRO-3, on the same "
                 "stand-ins")
        rows = [lora_row(outcome, run) for outcome, run in found]
        columns = LORA_COLUMNS
        command = "`; `".join(f"python benchmarks/families_vllm.py {call}" for call in LORA_CALLS)
        note = ("Each sync's mode: `adapter` (vLLM's LoRA serves the adapters: the first sync sends the base "
                "unmerged with them, `base+adapter`, then each sends only lora_A/lora_B, the adapter bytes shown), "
                "or `dense`/`sparse` (vLLM holds the policy merged, for the reason shown). Adapter groups verified: "
                "the adapter matrices' bit checksums compared with the matrices vLLM serves, per sync. The "
                "self-check compares vLLM's logprobs (with the LoRA) with the policy's, as above; at 1e-4 the "
                "adapters move the logprobs less than its bf16 noise, at 1e-2 well past it.")
    else:
        title = (f"{SECTIONS[''][2:]} (a refused family also --vllm server), {dtype}, learning rate {rates}, 2 CPU "
                 "processes under ZeRO-3, on stand-ins of real families (tests/families/build.py)")
        rows = [row(outcome, run) for outcome, run in found]
        columns, command = COLUMNS, "python benchmarks/families_vllm.py"
        note = ("A sync's bytes are all ranks' together, from rank 0's record (the first sync is dense; in bf16 a "
                "later one sends only what changed, a partition of which too much changed whole). The self-check "
                "compares vLLM's logprobs with the policy's on a probe after the first sync and the first update: "
                "its largest difference over both, on both ranks. A \"server (gather)\" row is a family refused "
                "under colocate, trained with `--vllm server --gather` against `rlhf vllm-serve grpo` on its "
                "stand-in, as the refusal advises; the logprob self-check runs colocated only, so such a row has "
                "none.")
    print_table(title, columns, rows)
    return f"# {title}\n\n{markdown_table(columns, rows)}\n{note}\n\nReproduce: `{command}`\n"


def kept_sections(page: Path) -> dict[str, str]:
    """The sections of the page as last written, by kind ("" or "lora")."""
    if not page.is_file():
        return {}
    text, kept = page.read_text(), {}
    starts = sorted((text.find(heading), kind) for kind, heading in SECTIONS.items() if heading in text)
    for (start, kind), (end, _) in zip(starts, [*starts[1:], (len(text), "")], strict=True):
        kept[kind] = text[start:end].rstrip("\n") + "\n"
    return kept


def report(work: Path, out: Path, dtype: str) -> None:
    """Print and write the table of every finished run (rewritten after every run); a section none of whose runs
    are in the work folder is kept from the page as it was."""
    order = list(EVERY_FAMILY)
    found = sorted(outcomes(work), key=lambda item: (order.index(item[0].family), item[0].lora,
                                                     [*GATHERS, SERVED].index(item[0].gather), item[0].rate))
    page = out / "families_vllm.md"
    sections = kept_sections(page)
    for kind in SECTIONS:
        runs = [(outcome, run) for outcome, run in found if bool(outcome.lora) == bool(kind)]
        if runs:
            sections[kind] = section(runs, kind, dtype)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(sections[kind] for kind in SECTIONS if kind in sections))
    print(f"wrote {page}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=DEFAULT_FAMILIES, choices=list(EVERY_FAMILY))
    parser.add_argument("--gathers", nargs="+", default=list(GATHERS), choices=list(GATHERS))
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--learning-rate", help="default 1e-6 (an RL one: most bf16 weights keep their bits); 1e-4 "
                                                "with --lora")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (their own runs and section)")
    parser.add_argument("--lora-targets", nargs="+", default=["default"], choices=list(LORA_TARGETS),
                        help="with --lora: PEFT's default targets for the family, and/or all-linear")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=WORK, help="where the stand-ins and the runs go (not in git)")
    parser.add_argument("--fresh", action="store_true", help="forget the runs of earlier calls")
    parser.add_argument("--report-only", action="store_true", help="write the table of the finished runs, run none")
    args = parser.parse_args()
    work = args.work_dir / "runs" / "families_vllm"
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    rate = args.learning_rate or RATES["lora" if args.lora else ""]
    settings = [Setting(args.dtype, rate, targets) for targets in args.lora_targets] if args.lora else [
        Setting(args.dtype, rate)]
    for setting in [] if args.report_only else settings:
        for family in args.families:
            for gather in args.gathers:
                print(f"{family}, {setting.lora or 'full'}, {gather} ...", flush=True)
                run_one(family, gather, setting, work)
                report(work, args.out, args.dtype)
            if advised_server(family, work, setting.lora):
                print(f"{family}, {SERVED} ...", flush=True)
                run_served(family, setting, work)
                report(work, args.out, args.dtype)
    if args.report_only:
        report(work, args.out, args.dtype)


if __name__ == "__main__":
    main()
