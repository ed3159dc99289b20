"""Everything the CLI prints: data to stdout, notes and errors to stderr (the error boundary is cli/errors.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.panel import Panel
from rich.segment import Segments
from rich.table import Table
from rich.text import Text

from rlhf_cli.algorithms import algorithm
from rlhf_cli.config.run import ResolvedRun
from rlhf_cli.launch.runner import Outcome
from rlhf_cli.machine import corrections
from rlhf_cli.phases import Phase
from rlhf_cli.plan.measured import corrected_factors, phase_rows, usable_memory, verdict, whole_run
from rlhf_cli.plan.memory import MARGIN
from rlhf_cli.plan.summary import time_lines
from rlhf_cli.sizes import readable

if TYPE_CHECKING:
    from rlhf_cli.plan.columns import Column, Plan

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)


def print_json(value: Any) -> None:
    """Every command's `--json`: one JSON document on stdout, indented, anything else (paths) as text."""
    print(json.dumps(value, indent=2, default=str))


def print_error(line: str) -> None:
    """`Error: ...` on stderr; the line is printed as text, never read as markup (a path may hold `[/x]`)."""
    stderr.print(Text.assemble(("Error:", "bold red"), " ", line), highlight=False)


def print_notes(run: ResolvedRun) -> None:
    for note in run.notes:
        style = "yellow" if note.startswith("warning:") else "dim"
        stderr.print(note, style=style, highlight=False, markup=False)


def _run_dict(run: ResolvedRun, plan: Plan) -> dict[str, Any]:
    from rlhf_cli.launch.command import launch_command

    launch = launch_command(run)
    return {
        "algorithm": run.algorithm,
        "recipe": str(run.recipe) if run.recipe else None,
        "trainer": run.group("trainer"),
        "model": run.group("model"),
        "script": run.group("script"),
        "zero3": run.group("zero3"),
        "accelerate": run.accelerate,
        "launch": {"argv": launch.argv, "env": launch.env, "command": launch.shell()},
        "sources": {name: setting.source for name, setting in run.settings.items()},
        "notes": list(run.notes),
        "plan": plan.as_dict(),
    }


def print_run_json(run: ResolvedRun, plan: Plan) -> None:
    print_json(_run_dict(run, plan))


def _gib(value: int) -> str:
    return f"{value / 2**30:.1f}"


def _plan_verdict(plan: Plan) -> str:
    """The plan's verdict and what would fit instead, one per line; or why there is no plan."""
    if not plan.known:
        return f"unknown: {plan.why_unknown}"
    return "\n".join([plan.reason, *(f"instead: {suggestion}" for suggestion in plan.suggestions)])


def print_plan_compact(plan: Plan) -> None:
    """The plan in a few lines on stderr, before a dry run's output."""
    chosen = plan.chosen
    style = "yellow" if chosen is not None and not chosen.fits else "dim"
    for line in _plan_verdict(plan).splitlines():
        stderr.print(f"plan: {line}", style=style, highlight=False, markup=False)


def _count(params: int) -> str:
    return next(f"{params / scale:.3g}{unit}" for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1, ""))
                if params >= scale or unit == "")


def _plan_table(title: str, columns: list[Column], gpu_memory: int) -> Table:
    """One row per component (those holding nothing in any column left out), one column per configuration."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    table.add_column("", style="cyan", no_wrap=True)
    for column in columns:
        header = f"{column.candidate.mode}\n{column.candidate.offload_short}{' *' if column.chosen else ''}"
        table.add_column(header, justify="right", no_wrap=True, style="bold reverse" if column.chosen else None)
    names = [part.name for part in columns[0].components]
    for index, name in enumerate(names):
        if any(column.components[index].gpu for column in columns):
            table.add_row(name, *(_gib(column.components[index].gpu) for column in columns))
    table.add_section()
    table.add_row("peak per GPU", *(_gib(column.peak) for column in columns), style="bold")
    usable = _gib(int(gpu_memory * (1 - MARGIN)))
    table.add_row(f"fits in {usable}", *("[green]yes[/]" if c.fits else "[red]no[/]" for c in columns))
    table.add_row("CPU per machine", *(_gib(column.cpu_per_machine) for column in columns), style="dim")
    if all(column.seconds is not None for column in columns):
        table.add_section()
        for phase in Phase:
            if any(column.seconds and column.seconds[phase] for column in columns):
                table.add_row(f"s/step {phase}", *(_seconds(column.seconds[phase] if column.seconds else 0.0)
                                                   for column in columns), style="dim")
        table.add_row("s per step", *(_seconds(column.step_seconds or 0.0) for column in columns), style="bold")
    return table


def _seconds(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def _vllm_description(columns: list[Column]) -> str:
    candidate = columns[0].candidate if columns else None
    settings = candidate.engine_settings if candidate else None
    return settings.description(candidate.generation.engine) if candidate and settings else ""


def _lora_summary(run: ResolvedRun) -> str:
    """The adapters the LoRA columns count."""
    targets = run.value("lora_target_modules")
    return f"rank {run.value('lora_r')}, {', '.join(targets) if targets else 'PEFT default targets'}"


def print_whole(table: Table) -> None:
    """A table on stdout that never cuts a number off: wider than the terminal (or a log's 80 columns), it is
    printed whole and the terminal wraps it."""
    width = max(stdout.width, Measurement.get(stdout, stdout.options.update_width(10**4), table).maximum)
    stdout.print(Segments(stdout.render(table, stdout.options.update_width(width))))


def print_plan_table(run: ResolvedRun, plan: Plan, *, as_json: bool) -> None:
    """`rlhf plan`: one row per component, one column per configuration, the run's own marked with *."""
    if as_json:
        print_json(plan.as_dict())
        return
    if not plan.known:
        stdout.print(f"plan: unknown: {plan.why_unknown}", highlight=False, markup=False)
        return
    assert plan.work is not None and plan.hardware is not None
    hardware = plan.hardware
    command = algorithm(run.algorithm).command
    vllm_columns = [c for c in plan.columns if c.candidate.engine_settings is not None]
    tables = ((f"rlhf plan {command}: GiB per GPU on {hardware.total_gpus} GPU(s)",
               [c for c in plan.columns if not c.candidate.lora and c.candidate.engine_settings is None]),
              (f"with --lora ({_lora_summary(run)}): base frozen, no reference copy",
               [c for c in plan.columns if c.candidate.lora and c.candidate.engine_settings is None]),
              (f"with vLLM ({_vllm_description(vllm_columns)}): gather, "
               "budget, no-gather = what the weight sync gathers at once", vllm_columns))
    for title, columns in tables:
        if columns:
            print_whole(_plan_table(title, columns, hardware.gpu_memory))
    models = "; ".join(f"{role.name} {role.path} {_count(role.size.params)}{' (trained)' if role.trained else ''}"
                       + (f", LoRA {_count(role.adapter.params)}" if role.adapter else "") for role in plan.roles)
    work = plan.work
    lines = [f"GPU memory: {hardware.source}; fits: peak at most {1 - MARGIN:.0%} of it",
             "offload: none; opt = optimizer to CPU; opt+par = optimizer and parameters to CPU; * the run's own",
             "peak = static rows + the largest of the gen, train, step and sync rows", f"models: {models}",
             "vLLM: its budget (vllm_gpu_memory_utilization x the GPU's memory: weights / TP, KV cache) and CUDA "
             "graphs stay while training unless it sleeps (then about 1 GiB); sync: the policy gathered at once "
             "to refresh vLLM (gather: all, a budget, no-gather: one unit), on top of training's reserve or, "
             "asleep, of vLLM's woken weights"]
    for line in lines:
        stdout.print(line, highlight=False, markup=False)
    stdout.print(f"per GPU: generation batch {work.generation_batch} x ({work.prompt_length} prompt + "
                 f"{work.completion_length} completion tokens), training micro-batch {work.train_batch} x "
                 f"{work.train_sequence} tokens, {work.element_bytes}-byte elements, gradient checkpointing "
                 f"{'on' if work.gradient_checkpointing else 'off'}, {work.attention} attention"
                 f"{', Liger kernels' if work.liger else ''}", highlight=False, markup=False)
    stdout.print(f"* the run's own: {plan.reason}", highlight=False, markup=False)
    batch, generation = plan.largest_generation_batch, plan.chosen.candidate.generation if plan.chosen else None
    if generation is not None and generation.engine.spec.is_server:
        line = "generation batch: on the vLLM server's own GPUs, not planned here"
    elif generation is not None and generation.engine.separate:
        line = (f"generation batch: vLLM's KV cache holds {batch or 0} sequences of {work.prompt_length} + "
                f"{work.completion_length} tokens per process (now {work.generation_batch})")
    else:
        line = (f"generation batch: up to {batch} sequences per GPU fit with the run's own configuration (now "
                f"{work.generation_batch})" if batch else "generation batch: not even 1 sequence per GPU fits")
    stdout.print(line, highlight=False, markup=False)
    for line in [*time_lines(plan), *(f"instead: {line}" for line in plan.suggestions)]:
        stdout.print(line, highlight=False, markup=False)
    for line in plan.engine_findings:
        stdout.print(f"vLLM: {line}", highlight=False, markup=False)
    for note in plan.notes:
        stdout.print(f"note: {note}", style="yellow", highlight=False, markup=False)


def _settings_table(run: ResolvedRun) -> Table:
    table = Table(title=f"rlhf {algorithm(run.algorithm).command}: resolved run", title_justify="left")
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("from", style="dim")
    for name in sorted(run.settings):
        setting = run.settings[name]  # values and sources quote the user's text: never read as markup
        table.add_row(name, Text(json.dumps(setting.value, default=str)), Text(setting.source))
    return table


def _accelerate_table(run: ResolvedRun) -> Table:
    table = Table(title="accelerate / DeepSpeed", title_justify="left")
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value")
    deepspeed = run.accelerate.get("deepspeed_config") or {}
    rows = {key: run.accelerate.get(key) for key in ("distributed_type", "num_processes", "num_machines",
                                                      "machine_rank", "main_process_ip", "main_process_port",
                                                      "mixed_precision", "use_cpu")}
    rows.update({f"deepspeed_config.{key}": value for key, value in deepspeed.items()})
    for key, value in rows.items():
        if value is not None:
            table.add_row(key, Text(str(value)))
    return table


def print_run_human(run: ResolvedRun) -> None:
    from rlhf_cli.launch.command import launch_command

    stdout.print(_settings_table(run))
    stdout.print(_accelerate_table(run))
    stdout.print("[bold]launch[/]")
    stdout.print(launch_command(run).shell(), highlight=False, markup=False)
    print_notes(run)


def _precision(run: ResolvedRun) -> str:
    return "bf16" if run.value("bf16") else "fp16" if run.value("fp16") else "fp32"


def _agent_code(run: ResolvedRun) -> str:
    """The tools and environments a GRPO run hands the trainer; nothing for a run without (or another trainer)."""
    tools = run.settings.get("tools")
    factory = run.settings.get("environment_factory")
    named = list(tools.value or []) if tools else []
    if factory and isinstance(factory.value, dict):
        named += [f"{name}: {spec}" for name, spec in factory.value.items()]
    elif factory and factory.value:
        named.append(str(factory.value))
    return ", ".join(named)


def print_header(run: ResolvedRun, plan: Plan) -> None:
    """The run at a glance, before the ranks start talking."""
    deepspeed = run.accelerate.get("deepspeed_config") or {}
    rows = {
        "policy": run.value("model_name_or_path"),
        "reward": ", ".join(filter(None, [run.value("reward_model_name_or_path"), *(run.value("reward_funcs") or [])])),
        "value model": run.value("value_model_name_or_path") if algorithm(run.algorithm).trains_value_model
        else None,
        "tools": _agent_code(run),
        "dataset": run.value("dataset_name"),
        "processes": f"{run.accelerate.get('num_processes')} on {run.accelerate.get('num_machines') or 1} machine(s)",
        "ZeRO": f"stage {deepspeed.get('zero_stage', '-')}, " + run.generation.describe()
                + f", offload optimizer: {deepspeed.get('offload_optimizer_device', 'none')}"
                + f", params: {deepspeed.get('offload_param_device', 'none')}",
        "precision": _precision(run) + (" (CPU)" if run.cpu_only else ""),
        "steps": run.value("max_steps") if (run.value("max_steps") or 0) > 0 else None,
        "resume": run.value("resume_from_checkpoint"),
        "output": str(run.output_dir),
        "plan": _plan_verdict(plan),
    }
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="cyan", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in rows.items():
        if value not in (None, ""):
            grid.add_row(key, Text(str(value)))
    stderr.print(Panel(grid, title=f"rlhf {algorithm(run.algorithm).command}", title_align="left", expand=False))


def _summary_table(outcome: Outcome, plan: Plan | None) -> Table:
    summary = outcome.summary or {}
    table = Table(title=f"run {outcome.status}", title_justify="left", show_header=False)
    table.add_column(style="cyan", no_wrap=True)
    table.add_column()
    table.add_row("steps", f"{summary.get('global_step')}/{summary.get('max_steps')}")
    table.add_row("wall time", f"{outcome.wall_seconds:.0f} s")
    if summary.get("steps_per_second"):
        table.add_row("steps/s", f"{summary['steps_per_second']:.3g} (loading and saving included)")
    for label, value in algorithm(summary["algorithm"]).headline(summary.get("final_metrics") or {}):
        table.add_row(label, f"{value:.4g}")
    rows = [row for row in phase_rows(summary, plan) if row.seconds]
    if rows:
        table.add_row("s/step by phase", Text("  ".join(f"{row.phase} {_seconds(row.seconds or 0.0)}"
                                                         + (f" (plan {_seconds(row.planned_seconds)})"
                                                            if row.planned_seconds is not None else "")
                                                         for row in rows)))
        peaks = [row for row in rows if row.peak_bytes]
        kind = "GPU" if (summary.get("memory") or {}).get("kind") == "cuda" else "resident"
        table.add_row(f"peak {kind} memory", Text("  ".join(f"{row.phase} {readable(row.peak_bytes or 0)}"
                                                            for row in peaks) if peaks else _overall_peak(summary)))
    table.add_row("saved", Text(str(summary.get("saved"))))
    return table


def _overall_peak(summary: dict[str, Any]) -> str:
    memory = summary.get("memory") or {}
    return f"{readable(memory.get('overall_peak_bytes') or 0)} overall ({memory.get('note') or 'not per phase'})"


def planned_for(plan: Plan) -> str:
    """Which machine the planned column is for: the GPU the plan timed (named, detected or calibrated here)."""
    hardware = plan.hardware if plan.known else None
    if hardware is None or hardware.gpu is None:
        return "planned: no seconds (no GPU known; pass --gpu NAME, or run `rlhf doctor --calibrate`)"
    where = "this machine" if hardware.this_machine else "another machine than this one"
    return f"planned for {where}: {hardware.gpu.name} ({hardware.gpu_source})"


def phase_table(summary: dict[str, Any], plan: Plan) -> Table:
    """The rehearsal's table: each phase measured beside the plan's prediction, its peak beside the memory the plan
    planned against."""
    usable = usable_memory(plan)
    table = Table(title="rehearsal: one step at the longest prompts and full-length completions", title_justify="left",
                  box=box.SIMPLE_HEAD, caption=planned_for(plan), caption_justify="left")
    for header in ("phase", "s/step", "planned s/step", "peak memory", "fits in"):
        table.add_column(header, justify="left" if header == "phase" else "right", no_wrap=True)
    for row in phase_rows(summary, plan):
        planned = _seconds(row.planned_seconds) if row.planned_seconds is not None else "-"
        peak = readable(row.peak_bytes) if row.peak_bytes else "-"
        table.add_row(row.phase, _seconds(row.seconds or 0.0), planned, peak, readable(usable) if usable else "-")
    return table


def print_outcome(outcome: Outcome, run: ResolvedRun, quiet: bool, plan: Plan | None = None) -> None:
    """How the ranks ended: the summary (its phases beside `plan`'s), what to do after a preemption, or why they
    failed: the failed rank's traceback, then one line. Text from ranks and libraries is printed as it is, never read
    as markup."""
    if outcome.status in ("finished", "preempted") and outcome.summary and not quiet:
        stderr.print(_summary_table(outcome, plan))
    if outcome.status == "preempted":
        stderr.print(f"Preempted: checkpoint {outcome.preempted['checkpoint']} is complete; continue with "
                     f"--resume auto --output-dir {run.output_dir} (exit code {outcome.exit_code})",
                     style="yellow", highlight=False, markup=False)
    elif outcome.status == "failed" and outcome.failure is not None:
        if outcome.failure.traceback:
            stderr.print(outcome.failure.traceback.rstrip(), highlight=False, markup=False)
        print_error(outcome.failure.line)
    elif outcome.status == "interrupted":
        stderr.print(f"Interrupted (exit code {outcome.exit_code})", style="yellow", markup=False)


def _whole_run_line(summary: dict[str, Any], plan: Plan, run: ResolvedRun) -> str:
    """`whole run (12 steps): 0:00:41 from the rehearsal's phases, 0:00:35 planned`, and whether this machine's
    corrections were kept."""
    steps = run.value("max_steps") or 0
    if steps <= 0:
        return "whole run: max_steps is not set, so no time for it (the rehearsal's phases are per step)"
    save_steps = run.value("save_steps") if str(run.value("save_strategy")) == "steps" else None
    measured, planned = whole_run(summary, plan, steps, int(save_steps) if save_steps else None)
    line = f"whole run ({steps} steps): {_clock(measured)} from the rehearsal's phases"
    line += f", {_clock(planned)} planned" if planned is not None else ", none planned (no GPU known)"
    factors = corrected_factors(summary, plan)
    hardware = plan.hardware if plan.known else None
    if factors and hardware is not None and hardware.this_machine and hardware.gpu is not None:
        corrections.remember(hardware.gpu.name, factors)
        line += f"; the next plan here corrects by {', '.join(f'{k} x{v:.3g}' for k, v in factors.items())}"
    return line


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def print_rehearsal(summary: dict[str, Any], plan: Plan, run: ResolvedRun) -> int:
    """The rehearsal's phases beside the plan, the whole run's time from them beside the plan's (kept as this
    machine's corrections for its next plan), and its verdict: 0 when the measured peak fits the memory the plan
    planned against, else 1 after one line naming the phase that went over and what would fit."""
    print_whole(phase_table(summary, plan))
    stdout.print(_whole_run_line(summary, plan, run), highlight=False, markup=False)
    found = verdict(summary, plan)
    if not found.fits:
        print_error(found.line)
        return 1
    stdout.print(f"rehearsal: {found.line}", highlight=False, markup=False)
    return 0
