"""The training commands and `rlhf plan`. They only parse flags, hand them to the config layer and print."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

from rlhf_cli.cli.flags import FLAGS, command_signature, contradiction, given_once, switch_settings
from rlhf_cli.generation.choice import GATHER_KEY

if TYPE_CHECKING:
    from rlhf_cli.config.run import ResolvedRun


# Extra arguments reach the command in `ctx.args`: `auto` of `--gather auto` (Typer flags take no value), and
# TRL-style flags (`--learning_rate 1e-6`, `--use_vllm`), any trainer field as TRL's CLI spells it.
EXTRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def train(ctx: typer.Context, **options: Any) -> None:
    """`rlhf ppo|rloo|online-dpo|...`: the command name picks the algorithm."""
    from rlhf_cli.cli.output import (
        print_header,
        print_notes,
        print_outcome,
        print_plan_compact,
        print_run_human,
        print_run_json,
    )
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
    from rlhf_cli.plan.time import final_save_seconds, planned_step_seconds

    needs = PlanNeeds(plan.chosen.cpu_per_machine if plan.chosen else None, plan.checkpoint_bytes,
                      final_save_seconds(plan), planned_step_seconds(plan))
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
    trl_flags = _accelerate_config_file(flags, trl_flags, problems)
    extra = _pasted_launcher(ctx.info_name, extra, flags, trl_flags, _recipe_keys(recipe))
    switches, contradictions = switch_settings(options)
    problems += contradictions
    flags.update(switches)
    _gather_auto(flags, options, extra, problems)
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


ACCELERATE_CONFIG_FLAGS = ("--config_file", "--config-file")  # accelerate launch's own spelling of its config


def _accelerate_config_file(flags: dict[str, tuple[str, Any]], trl_flags: tuple[tuple[str, tuple[str, ...]], ...],
                            problems: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """accelerate's `--config_file FILE` (`accelerate launch --config_file zero3.yaml grpo.py ...` pasted) is the
    accelerate config, as --accelerate-config."""
    given = [(flag, words) for flag, words in trl_flags if flag in ACCELERATE_CONFIG_FLAGS]
    rest = tuple((flag, words) for flag, words in trl_flags if flag not in ACCELERATE_CONFIG_FLAGS)
    if not given:
        return rest
    if "accelerate_config" in flags or len(given) > 1 or len(given[0][1]) != 1:
        problems.append(f"{given[0][0]} (accelerate's config file flag) names one accelerate config, the same as "
                        "--accelerate-config; give one of them, once, with its file")
        return rest
    flags["accelerate_config"] = (given[0][0], given[0][1][0])
    return rest


def _recipe_keys(recipe: str | None) -> set[str]:
    """The keys the recipe sets; none when it cannot be read (resolution says why)."""
    from rlhf_cli.config.recipe import load_recipe
    from rlhf_cli.errors import RlhfError

    try:
        return set(load_recipe(recipe).values) if recipe else set()
    except RlhfError:
        return set()


def _pasted_launcher(command: str, extra: list[str], flags: dict[str, tuple[str, Any]],
                     trl_flags: tuple[tuple[str, tuple[str, ...]], ...], recipe_keys: set[str]) -> list[str]:
    """The launcher words of a pasted line, taken off the extra arguments: `accelerate launch [SCRIPT.py]`,
    `trl ALGO`, `python SCRIPT.py`. Python starts one process where rlhf's default is one per GPU: a `python` line
    runs one unless its processes are given (--num-processes, or the recipe's num_processes)."""
    words = list(extra)
    if words[:2] == ["accelerate", "launch"] or words[:2] == ["trl", command]:
        del words[:2]
        if words[:1] and words[0].endswith(".py"):
            del words[0]
        return words
    if words[:1] and words[0] in ("python", "python3") and words[1:2] and words[1].endswith(".py"):
        given = "num_processes" in flags or "num_processes" in recipe_keys or any(
            flag.lstrip("-").replace("-", "_") == "num_processes" for flag, _ in trl_flags)
        if not given:
            flags["num_processes"] = (f"{words[0]} {words[1]}", 1)
        return words[2:]
    return words


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
        problems.append(contradiction("--quiet", "--verbose"))
    return problems


def _gather_auto(flags: dict[str, Any], options: dict[str, Any], extra: list[str], problems: list[str]) -> None:
    """`--gather auto` (Typer's flags take no value: `auto` arrives as an extra argument); any other word, or one
    without `--gather`, is a problem."""
    gather = options["gather"]
    if not extra or (gather and options["no_gather"]):  # the pair's contradiction is the problem to report
        return
    if gather and extra == ["auto"]:
        flags[GATHER_KEY] = ("--gather auto", "auto")
        return
    hint = "; did you mean --gather auto?" if "auto" in extra and not gather else ""
    problems.append(f"unexpected argument {' '.join(extra)!r}{hint}")
    flags.pop(GATHER_KEY, None)
