"""Helpers shared by the benchmark scripts: their common options and model, run a command with timing, serve vLLM,
read the ranks' probe records, print tables, draw bar charts."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
RESULTS = Path(__file__).resolve().parent / "results"
WORK = Path(__file__).resolve().parent / ".work"
MIB = 2**20
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}  # vLLM's CPU build: a 1 GiB KV cache, little for a shared CPU
SMOKE_POLICY = RECIPES / "smoke" / "policy"
# Scaled-up smoke policy: 14 layers of 7.1M parameters, about 100M in all (the 500-token vocabulary keeps the
# embeddings small).
MODEL_SHAPE = {"hidden_size": 768, "num_hidden_layers": 14, "intermediate_size": 2048,
               "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 64}


def benchmark_parser(doc: str | None, steps_help: str) -> argparse.ArgumentParser:
    """The options of the benchmarks that run the 100M model: steps, completion length, where results and runs go."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help=steps_help)
    parser.add_argument("--completion-length", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=WORK, help="where the model and the runs go (not in git)")
    return parser


def build_model(directory: Path) -> int:
    """Save the scaled-up random Llama (once; reused while its config matches) and return its parameter count."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    config = AutoConfig.from_pretrained(SMOKE_POLICY)
    config.update(MODEL_SHAPE)
    saved = directory / "config.json"
    complete = saved.exists() and (directory / "model.safetensors").exists()
    if not (complete and all(json.loads(saved.read_text()).get(k) == v for k, v in MODEL_SHAPE.items())):
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(directory)
        AutoTokenizer.from_pretrained(SMOKE_POLICY).save_pretrained(directory)
        shutil.copy(SMOKE_POLICY / "generation_config.json", directory)
    with torch.device("meta"):
        return LlamaForCausalLM(config).num_parameters()


def benchmark_model(work_dir: Path) -> tuple[Path, int]:
    """The 100M model under `work_dir` (built once) and its parameter count, said on stdout."""
    model = work_dir / "llama-100m"
    parameters = build_model(model)
    print(f"model: {parameters / 1e6:.1f}M parameters, {model}")
    return model, parameters


class CommandFailed(RuntimeError):
    """A measured command exited non-zero; the message carries the end of its output."""


@dataclass(frozen=True)
class Timed:
    seconds: float
    output: str


class CommandTimedOut(CommandFailed):
    """A measured command ran past its timeout; it was killed with every process it started."""


def run_timed(argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 600) -> Timed:
    """Run `argv` from the repository root (our code first on the path), and time it from start to exit.

    It runs in its own process group: on timeout the ranks it started are killed with it, not left holding
    memory (or a GPU) while the next command runs."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                **(env or {})}
    started = time.perf_counter()
    with subprocess.Popen(list(argv), cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise CommandTimedOut(f"{' '.join(argv)} ran past {timeout:.0f} s and was killed:\n"
                                  f"{(stdout + stderr)[-4000:]}") from None
    seconds = time.perf_counter() - started
    output = stdout + stderr
    if process.returncode != 0:
        raise CommandFailed(f"{' '.join(argv)} exited {process.returncode}:\n{output[-4000:]}")
    return Timed(seconds, output)


@contextmanager
def vllm_server(log: Path, *serve: str, timeout: float = 900) -> Iterator[str]:
    """`rlhf vllm-serve SERVE...` on a free port, its output to `log`; yields its URL once `/health` answers and
    stops it by its process group (the engine's workers with it) when the block ends."""
    import requests

    with socket_port() as port, log.open("w") as sink:
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, **VLLM_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                                      os.environ.get("PYTHONPATH")]))}
        server = subprocess.Popen(python_module("rlhf_cli", "vllm-serve", *serve, "--port", str(port)),
                                  stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=REPO)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if server.poll() is not None:
                    raise RuntimeError(f"rlhf vllm-serve exited:\n{log.read_text()[-3000:]}")
                try:
                    if requests.get(f"{url}/health", timeout=5).status_code == 200:
                        break
                except requests.ConnectionError:
                    time.sleep(2)
            else:
                raise RuntimeError(f"rlhf vllm-serve did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")
            yield url
        finally:
            with suppress(ProcessLookupError):  # a server that exited may have left nothing in its group
                os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)


@contextmanager
def socket_port() -> Iterator[int]:
    """A port free when asked (the server binds it a moment later)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    yield port


def json_output(output: str) -> Any:
    """The JSON object a command printed; the notes it writes to stderr may come before or after it."""
    return json.JSONDecoder().raw_decode(output[output.index("{"):])[0]


def python_module(module: str, *args: str) -> list[str]:
    """argv for `python -m module args` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def median_seconds(argv: Sequence[str], repeats: int, env: dict[str, str] | None = None) -> float:
    return statistics.median(run_timed(argv, env).seconds for _ in range(repeats))


def cache_model_configs(hub: Path, models: Mapping[str, str]) -> None:
    """Lay out the config.json of each fixture in tests/fixtures/models under `hub` as `hf download` does, for
    hub id -> fixture name: `rlhf plan` then sizes those hub models without a download."""
    for repo_id, fixture in models.items():
        snapshot = hub / f"models--{repo_id.replace('/', '--')}" / "snapshots" / "main"
        snapshot.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "tests" / "fixtures" / "models" / fixture / "config.json", snapshot / "config.json")
        (snapshot.parent.parent / "refs").mkdir(exist_ok=True)
        (snapshot.parent.parent / "refs" / "main").write_text("main")


# -- probe records ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankGeneration:
    """One rank's generation calls, summed up from the probe's per-call records in `ranks/rank-N.json`."""

    rank: int
    steps: int
    calls: int
    seconds_per_step: float
    all_gathers_per_call: float  # median over the calls
    gathered_peak_bytes: int  # largest ZeRO-3 parameter bytes gathered or being gathered at once
    gathered_peak_share: float  # of the whole model's bytes
    element_bytes: int  # bytes per parameter as the rank holds them (4 in fp32)
    rss_peak_bytes: int  # largest resident memory of the process during a call
    rss_peak_delta_bytes: int  # largest rise of the process's resident memory within one call


def read_rank_generation(record: dict[str, Any]) -> RankGeneration:
    """Summarise one rank record; fails with a clear message when the run was not probed."""
    calls = record.get("generation_probe", {}).get("per_call") or []
    if not calls:
        raise ValueError(f"rank {record.get('rank')} recorded no generation calls: was RLHF_PROBE_GENERATION=1 set?")
    steps = record["global_step"]
    return RankGeneration(
        rank=record["rank"], steps=steps, calls=len(calls),
        seconds_per_step=sum(call["seconds"] for call in calls) / max(steps, 1),
        all_gathers_per_call=statistics.median(call["all_gathers"] for call in calls),
        gathered_peak_bytes=max(call["peak_bytes"] for call in calls),
        gathered_peak_share=max(call["peak_bytes"] / call["full_bytes"] for call in calls),
        element_bytes=max(call["full_bytes"] // call["full_numel"] for call in calls),
        rss_peak_bytes=max(call["rss_peak_bytes"] for call in calls),
        rss_peak_delta_bytes=max(call["rss_peak_delta_bytes"] for call in calls))


def probe_calls(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Each rank's probe records of one run, one per generation call."""
    records = [json.loads(path.read_text()) for path in sorted((run_dir / "ranks").glob("rank-*.json"))]
    return {record["rank"]: record.get("generation_probe", {}).get("per_call") or [] for record in records}


def rank_generations(run_dirs: Sequence[Path]) -> list[RankGeneration]:
    """One summary per rank over several runs of the same mode: their calls pooled, their steps added up."""
    from rlhf_cli.output.run_dir import RunDir

    merged: dict[int, dict[str, Any]] = {}
    for run_dir in run_dirs:
        for path in RunDir(run_dir).rank_records():  # not their heartbeats or error records
            record = json.loads(path.read_text())
            into = merged.setdefault(record["rank"], {"rank": record["rank"], "global_step": 0,
                                                      "generation_probe": {"per_call": []}})
            into["global_step"] += record["global_step"]
            into["generation_probe"]["per_call"] += record.get("generation_probe", {}).get("per_call") or []
    return [read_rank_generation(merged[rank]) for rank in sorted(merged)]


# -- output -----------------------------------------------------------------------------------------

def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=160).print(table)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def bar_charts(path: Path, title: str, panels: Sequence[tuple[str, dict[str, float]]],
               markers: Mapping[str, dict[str, float]] | None = None, marker_label: str = "") -> None:
    """One PNG with a bar chart per panel: (y-axis label, {bar label: value}); `markers[panel label]` marks
    {bar label: value} beside those bars, named `marker_label` in the panel's legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(len(panels), 2)
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.2 * rows), squeeze=False)
    for axis, (label, bars) in zip(axes.flat, panels, strict=False):
        drawn = axis.bar(range(len(bars)), list(bars.values()), color="#4c72b0")
        axis.bar_label(drawn, fmt=bar_value)
        wanted = (markers or {}).get(label, {})
        marked = [(index, wanted[name]) for index, name in enumerate(bars) if name in wanted]
        if marked:  # a short thick line at each bar's right shoulder, clear of the bar's own label
            axis.hlines([value for _, value in marked], [index + 0.18 for index, _ in marked],
                        [index + 0.5 for index, _ in marked], colors="#c44e52", linewidth=3, zorder=3,
                        label=marker_label)
            axis.legend(loc="upper right", fontsize=9)
        axis.margins(y=0.15)
        axis.set_xticks(range(len(bars)), list(bars), rotation=15, ha="right")
        axis.set_title(label, fontsize=10)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def bar_value(value: float) -> str:
    """A bar's label: whole numbers from 100 up, else three significant digits."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def write_markdown(path: Path, text: str) -> None:
    """Write a results page, ending with the command line that produced it."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(REPO) if script.is_relative_to(REPO) else script
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text}\nReproduce: `python {' '.join([str(shown), *sys.argv[1:]])}`\n")
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
