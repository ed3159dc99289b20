"""The training commands and `rlhf plan`. They only parse flags, hand them to the config layer and print."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

from rlhf_cli.cli.flags import FLAGS, command_signature, given_once

if TYPE_CHECKING:
    from rlhf_cli.config.run import ResolvedRun


# Extra arguments reach the command in `ctx.args`: `auto` of `--gather auto` (Typer flags take no value), and
# TRL-style flags (`--learning_rate 1e-6`, `--use_vllm`), any trainer field as TRL's CLI spells it.
EXTRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def train(ctx: typer.Context, **options: Any) -> None:
    """`rlhf ppo|rloo|online-dpo|...`: the command name picks the algorithm."""
    from rlhf_cli.cli.output import print_header, print_notes, print_outcome, print_plan_compact, print_run_human, \
        print_run_json
    from rlhf_cli.launch.faults import PlanNeeds, space_warning
    from rlhf_cli.plan.estimate import planned

    options, repeated = given_once(options)
    run, plan = planned(_resolve(ctx, options, repeated, planning=False))
    low_space = space_warning(run.output_dir, plan.checkpoint_bytes)
    run = run.with_note(low_space) if low_space else run
    if options["dry_run"]:
        print_plan_compact(plan)
        print_run_json(run, plan) if options["json_"] else print_run_human(run)
        return
    rehearsed = run
    if options["rehearse"]:
        from rlhf_cli.config.rehearsal import rehearsal_run

        run = rehearsal_run(run)
    quiet = options["quiet"]
    if not quiet:
        print_notes(run)
        print_header(run, plan)
    from rlhf_cli.launch.runner import launch

    needs = PlanNeeds(plan.chosen.cpu_per_machine if plan.chosen else None, plan.checkpoint_bytes)
    outcome = launch(run, verbosity="quiet" if quiet else "verbose" if options["verbose"] else "normal", needs=needs,
                     overwrite=options["overwrite"] or options["rehearse"])  # a rehearsal's folder: its own files
    print_outcome(outcome, run, quiet, plan)
    if options["rehearse"] and outcome.exit_code == 0:
        from rlhf_cli.cli.output import print_rehearsal

        raise typer.Exit(print_rehearsal(outcome.summary or {}, plan, rehearsed))
    raise typer.Exit(outcome.exit_code)


def plan(ctx: typer.Context, **options: Any) -> None:
    """`rlhf plan ALGO`: the run's memory plan for every gather/offload choice; nothing is started or written.

    It takes every option of `rlhf ALGO`, so that any training command line is planned by inserting `plan`; the
    options that only decide how a run starts (--resume, --overwrite, --dry-run, -q, -v) change nothing here.
    """
    from rlhf_cli.cli.output import print_notes, print_plan_table
    from rlhf_cli.plan.estimate import plan_run

    options, repeated = given_once(options)
    run = _resolve(ctx, options, repeated, planning=True)
    plan = plan_run(run)
    print_plan_table(run, plan, as_json=options["json_"])
    print_notes(run)


# Typer reads a command's options from its signature: both commands take every flag of the table.
train.__signature__ = plan.__signature__ = command_signature()  # type: ignore[attr-defined]


def _resolve(ctx: typer.Context, options: dict[str, Any], repeated: list[str], planning: bool) -> ResolvedRun:
    """The run the flags ask for; `repeated`: the flags given more than once, reported with every other problem."""
    from rlhf_cli.config.resolve import RunRequest, resolve

    flags = {key: (flag, options[parameter]) for key, (flag, parameter) in FLAGS.items()
             if options.get(parameter) is not None}
    problems = repeated + _flag_problems(options, planning)
    from rlhf_cli.config.fields import catalogue

    algorithm = ctx.info_name.replace("-", "_")
    fields = catalogue(algorithm)
    trl_flags, extra = trl_style_flags(ctx.args, lambda key: key in fields and "list" in fields[key].kinds)
    recipe, trl_flags = _trl_config(options["recipe"], trl_flags, problems)
    gather = _gather_flag(options["gather"], options["no_gather"], extra, problems)
    if gather is not None:
        flags["ds3_gather_for_generation"] = gather
    if options["vllm"] is not None and options["no_vllm"]:
        problems.append("--vllm and --no-vllm contradict each other; keep one")
    elif options["vllm"] is not None:
        flags["use_vllm"] = ("--vllm", True)
        flags["vllm_mode"] = ("--vllm", options["vllm"])
    elif options["no_vllm"]:
        flags["use_vllm"] = ("--no-vllm", False)
    if options["lora"] and options["no_lora"]:
        problems.append("--lora and --no-lora contradict each other; keep one")
    elif options["lora"] or options["no_lora"]:
        flags["use_peft"] = ("--lora", True) if options["lora"] else ("--no-lora", False)
    if options["merge_adapter"]:
        flags["merge_adapter"] = ("--merge-adapter", True)
    return resolve(RunRequest(algorithm, recipe, flags, tuple(options["set_"] or ()),
                              options.get("overwrite", False), planning=planning, problems=tuple(problems),
                              trl_flags=trl_flags))


def trl_style_flags(args: list[str], takes_list: Callable[[str], bool] = lambda key: False,
                    ) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], list[str]]:
    """TRL's CLI spelling of recipe keys among the extra arguments, as HfArgumentParser splits them: a list field
    takes every word up to the next option (`--report_to wandb tensorboard`), any other key one word at most
    (`--key value`, `--key=value`, or `--key` alone), as (flag as typed, its words); the other arguments as they
    came."""
    found: list[tuple[str, tuple[str, ...]]] = []
    rest: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        if not token.startswith("--") or token == "--":
            rest.append(token)
            continue
        flag, equals, text = token.partition("=")
        words = [text] if equals else []
        many = takes_list(flag[2:].replace("-", "_"))
        while not equals and index < len(args) and not _is_option(args[index]) and (many or not words):
            words.append(args[index])
            index += 1
        found.append((flag, tuple(words)))
    return tuple(found), rest


def _trl_config(recipe: str | None, trl_flags: tuple[tuple[str, tuple[str, ...]], ...], problems: list[str],
                ) -> tuple[str | None, tuple[tuple[str, tuple[str, ...]], ...]]:
    """TRL's `--config FILE` is the recipe (`trl grpo --config recipe.yaml ...` pastes after `rlhf grpo`)."""
    configs = [words for flag, words in trl_flags if flag == "--config"]
    rest = tuple((flag, words) for flag, words in trl_flags if flag != "--config")
    if not configs:
        return recipe, rest
    if recipe is not None or len(configs) > 1 or len(configs[0]) != 1:
        problems.append("--config (TRL's recipe flag) names one recipe, the same as -r; give one of them, once")
        return recipe, rest
    return configs[0][0], rest


def _is_option(token: str) -> bool:
    """As argparse decides: `--x` and `-x` are options, `-1` and `-1e-6` are (negative) values."""
    return token.startswith("-") and len(token) > 1 and not token[1].isdigit() and not token[1] == "."


def _flag_problems(options: dict[str, Any], planning: bool) -> list[str]:
    """Flags that contradict each other; reported with every other problem of the run."""
    problems = []
    if options["json_"] and not options["dry_run"] and not planning:
        problems.append("--json goes with --dry-run (or rlhf plan); add --dry-run or drop --json")
    if options["rehearse"] and options["dry_run"] and not planning:  # rlhf plan plans the run itself
        problems.append("--rehearse runs one step; it does not go with --dry-run")
    if options["quiet"] and options["verbose"]:
        problems.append("--quiet and --verbose contradict each other; keep one")
    return problems


def _gather_flag(gather: bool, no_gather: bool, extra: list[str], problems: list[str]) -> tuple[str, Any] | None:
    """The flag as typed and its value: --gather, --no-gather, or --gather auto; any other word is a problem."""
    if gather and no_gather:
        problems.append("--gather and --no-gather contradict each other; keep one")
        return None
    if gather and extra == ["auto"]:
        return ("--gather auto", "auto")
    if extra:
        hint = "; did you mean --gather auto?" if "auto" in extra and not gather else ""
        problems.append(f"unexpected argument {' '.join(extra)!r}{hint}")
        return None
    if gather or no_gather:
        return ("--gather", True) if gather else ("--no-gather", False)
    return None
