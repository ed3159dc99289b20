"""The checkpoint a run resumes, and that checkpoint resumed on another number of processes (a preempted job
requeued on the GPUs that are free).

`--resume auto` takes the newest whole checkpoint of the output dir; a given one is checked whole
(`find_resume_point`). The run keeps the checkpoint's global batch, processes x per_device_train_batch_size x
gradient_accumulation_steps: the accumulation steps take up what the processes changed, so the optimizer steps,
the learning-rate schedule and the data position (steps x global batch prompts) stay those of the run that saved
it. Where the count does not divide, the resume is refused. The ranks re-split ZeRO-3's shards
(rlhf_cli/rank/reshard.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhf_cli.config.accelerate import zero_stage
from rlhf_cli.config.draft import Draft
from rlhf_cli.config.file_checks import LORA_KEYS, adapter_problem, checkpoint_problem
from rlhf_cli.config.paths import path_state
from rlhf_cli.config.run import RESUME_AUTO, Setting
from rlhf_cli.output.checkpoints import (
    deepspeed_tag,
    incomplete_reason,
    newest_complete_checkpoint,
    saved_by,
    saved_processes,
)
from rlhf_cli.output.run_dir import MANIFEST, RunDir

MOST_PROCESSES_NAMED = 8  # process counts a refusal suggests
NOTHING_TO_RESUME = ": nothing to resume"  # the source of `--resume auto` that found no checkpoint


def check_checkpoint(draft: Draft, accelerate: dict[str, Any]) -> None:
    """The checkpoint resumed is one this run's trainer can load (rlhf_cli/config/file_checks.py); refused, the
    batch is not adjusted to it."""
    setting = draft.settings.get("resume_from_checkpoint")
    if setting is None or not isinstance(setting.value, str) or "resume_from_checkpoint" in draft.refused or \
            not Path(setting.value).is_absolute():
        return
    model = draft.value("model_name_or_path") if "model_name_or_path" not in draft.refused else None
    lora = {key: draft.value(key) for key in LORA_KEYS if key in draft.fields and key not in draft.refused}
    problem = (draft.value("use_peft") is True and adapter_problem(Path(setting.value), lora)) or \
        checkpoint_problem(Path(setting.value), draft.value("use_peft") is True, model, draft.request.algorithm,
                           deepspeed=zero_stage(accelerate) is not None)
    if problem:
        draft.problems.append(f"--resume {setting.value}: {problem}")
        draft.refused.add("resume_from_checkpoint")


def keep_global_batch(draft: Draft, accelerate: dict[str, Any]) -> None:
    """Adjust gradient_accumulation_steps (and an explicit steps_per_generation) to the checkpoint's global batch
    on this run's process count, or say why it cannot be kept."""
    setting = draft.settings.get("resume_from_checkpoint")
    names = {"resume_from_checkpoint", "per_device_train_batch_size", "gradient_accumulation_steps"}
    if setting is None or setting.value is None or names & draft.refused:
        return
    checkpoint = Path(setting.value)
    processes = int(accelerate.get("num_processes") or 1)
    saved = saved_processes(checkpoint)
    if saved is None or saved == processes:
        return
    said = f"--resume {checkpoint}"
    stage = zero_stage(accelerate)
    if deepspeed_tag(checkpoint) is not None and stage != 3:
        draft.problems.append(f"{said}: saved by {saved} processes, and this run has {processes}: rlhf re-splits "
                              f"ZeRO-3 shards only, and this run's DeepSpeed is ZeRO stage {stage}; run "
                              f"--num-processes {saved}, or resume under ZeRO-3")
        return
    per_device = draft.value("per_device_train_batch_size")
    recorded = saved_by(checkpoint)
    global_batch = recorded.global_batch if recorded else saved * per_device * draft.value(
        "gradient_accumulation_steps")  # an older manifest: the batch layout of this run, as the same recipe has
    accumulation, rest = divmod(global_batch, processes * per_device)
    if rest or not accumulation:
        fitting = [count for count in range(1, global_batch // per_device + 1)
                   if global_batch % (count * per_device) == 0][:MOST_PROCESSES_NAMED]
        draft.problems.append(f"{said}: it was trained with a global batch of {global_batch} ({saved} processes), "
                              f"which {processes} processes x per_device_train_batch_size {per_device} cannot keep "
                              f"(gradient_accumulation_steps would be {global_batch / (processes * per_device):g}); "
                              f"run {', '.join(map(str, fitting))} processes, or a per_device_train_batch_size that "
                              f"times {processes} divides {global_batch}")
        return
    why = f"rlhf: keeps {checkpoint.name}'s global batch {global_batch} on {processes} process" + \
        ("es" if processes > 1 else "")
    draft.settings["gradient_accumulation_steps"] = Setting(accumulation, why)
    _scale_steps_per_generation(draft, saved, processes, said)
    draft.notes.append(f"{said}: saved by {saved} processes, resumed on {processes}: gradient_accumulation_steps "
                       f"{accumulation} keeps its global batch of {global_batch}, the schedule and the data position; "
                       f"{_what_changes(saved, processes, deepspeed_tag(checkpoint) is not None)}")


def _scale_steps_per_generation(draft: Draft, saved: int, processes: int, said: str) -> None:
    """RLOO's and GRPO's generation batch is per_device x processes x steps_per_generation: one given explicitly
    scales as the accumulation does (unset, it follows gradient_accumulation_steps)."""
    setting = draft.settings.get("steps_per_generation")
    if "steps_per_generation" not in draft.fields or setting is None or setting.value is None:
        return
    scaled, rest = divmod(setting.value * saved, processes)
    if rest:
        draft.problems.append(f"{said}: steps_per_generation {setting.value} on {saved} processes has no equal on "
                              f"{processes}; run {saved} processes, or set generation_batch_size instead (it counts "
                              "prompts of all processes)")
    else:
        draft.settings["steps_per_generation"] = Setting(scaled, f"rlhf: keeps the generation batch on {processes} "
                                                                 "processes")


def _what_changes(saved: int, processes: int, deepspeed: bool) -> str:
    """What a resume on another count cannot keep exactly, said once."""
    shards = "ZeRO-3's shards are re-split through DeepSpeed's universal checkpoint at start; " if deepspeed else ""
    kept = "rank 0 continues rank 0's random numbers" if min(saved, processes) == 1 else \
        f"{_ranks(0, min(saved, processes))} continue their own random numbers"
    if processes < saved:
        return f"{shards}{kept}, those of {_ranks(processes, saved)} are dropped, so the samples drawn differ"
    return f"{shards}{kept}, {_ranks(saved, processes)} start from the seed, so the samples drawn differ"


def _ranks(first: int, end: int) -> str:
    return f"rank {first}" if end - first == 1 else f"ranks {first}-{end - 1}"


def find_resume_point(draft: Draft) -> None:
    """`auto`: the newest whole checkpoint in the output dir; a given one: check that it is whole."""
    setting = draft.settings.get("resume_from_checkpoint")
    if setting is None or setting.value is None or {"resume_from_checkpoint", "output_dir"} & draft.refused:
        return
    draft.resume_asked = setting.value
    if setting.value != RESUME_AUTO:
        checkpoint = Path(setting.value)
        if RunDir(checkpoint).checkpoints() or path_state(RunDir(checkpoint).run_record).kind == "file":
            draft.problems.append(f"--resume {setting.value}: is a run's output dir, not one of its checkpoints; "
                                  "pass --resume auto (its newest complete checkpoint, with -o on it) or a "
                                  "checkpoint-N directory in it")
            draft.refused.add("resume_from_checkpoint")
            return
        reason = incomplete_reason(checkpoint)
        # A save that finished and was damaged since, or one of an rlhf run that never finished, is refused; a
        # checkpoint rlhf did not write (TRL's, transformers') has no manifest: the user's call.
        if reason and ((checkpoint / MANIFEST).is_file() or RunDir(checkpoint.parent).written.is_file()):
            draft.problems.append(f"--resume {setting.value}: {reason}; pass an earlier checkpoint, or --resume auto "
                                  "(the newest whole one)")
            draft.refused.add("resume_from_checkpoint")
        elif reason:
            draft.notes.append(f"warning: --resume {setting.value}: {reason}; resuming from it as given")
        return
    if draft.settings["output_dir"].source == "default":
        draft.problems.append("--resume auto looks for checkpoints in the output dir, and the default "
                              "runs/ALGO-TIME is new every time: pass --output-dir DIR")
        return
    output_dir = Path(draft.value("output_dir"))
    point = newest_complete_checkpoint(output_dir)
    draft.notes.extend(f"warning: --resume auto: skipping {line}" for line in point.skipped)
    if point.checkpoint is None:
        draft.notes.append(f"--resume auto: no complete checkpoint in {output_dir}; starting from the beginning")
        draft.settings["resume_from_checkpoint"] = Setting(None, f"{setting.source} auto{NOTHING_TO_RESUME}")
    else:
        draft.notes.append(f"--resume auto: continuing from {point.checkpoint}")
        draft.settings["resume_from_checkpoint"] = Setting(str(point.checkpoint), f"{setting.source} auto")
