"""Entry point of every rank: `python -m rlhf_cli.rank ALGORITHM RECIPE`, started by accelerate.

It reads the resolved recipe the launcher wrote and never sees the user's command line.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from rlhf_cli.output.run_dir import EXIT_PREEMPTED
from rlhf_cli.rank.inputs import RankInputs


def main(argv: list[str]) -> int:
    started = time.monotonic()
    name, recipe_path = argv
    inputs = RankInputs.read(name, Path(recipe_path))
    output_dir = Path(inputs.trainer["output_dir"])
    from rlhf_cli.output.run_dir import RunDir
    from rlhf_cli.rank import terminal

    rank = int(os.environ.get("RANK", "0"))
    # Before torch, DeepSpeed and datasets are imported: what they print goes to the rank's log file.
    terminal.keep_terminal_for_rlhf(terminal.output_mode(), RunDir(output_dir).rank_log(rank))
    terminal.PHASES.shown = rank == 0 and terminal.output_mode() != "quiet"
    terminal.PHASES.show("importing torch, transformers, TRL and DeepSpeed")
    inputs.hide_unused_engines()

    from rlhf_cli.rank.lifecycle import (
        CheckpointAndStop,
        CompleteCheckpoints,
        MovesAndPhases,
        StopRequest,
        failures_recorded,
        global_rank,
    )
    from rlhf_cli.rank.progress import quiet_libraries, use_progress
    from rlhf_cli.rank.watch import Watch, count_progress

    stop = StopRequest(output_dir)
    stop.install()  # before loading models: a job can be preempted while it loads
    # Started before loading too: a rank lost while the others load stops them as well.
    watch = Watch(RunDir(output_dir), float(inputs.launch_value("stall_timeout"))).start()
    with failures_recorded(output_dir):
        count_progress()  # before DeepSpeed and accelerate take references to torch's collectives
        quiet_libraries(terminal.output_mode(), is_rank_zero=global_rank() == 0)
        from rlhf_cli.algorithms import algorithm
        from rlhf_cli.algorithms.spec import load_object
        from rlhf_cli.rank.engines import prepare_engine
        from rlhf_cli.rank.record import write_rank_record
        from rlhf_cli.rank.reshard import loadable_checkpoint
        from rlhf_cli.rank.zero3 import install_generation_context

        generation = inputs.generation()
        install_generation_context(required=generation.gather.through_shards, budget=generation.gather.budget)
        terminal.PHASES.show("loading the models")
        prepare_engine(generation.engine.spec)
        trainer = load_object(algorithm(name).builder)(inputs)
        use_progress(trainer, name)
        terminal.PHASES.show("building the DeepSpeed engine")  # in train(), until its first callback
        stopper = CheckpointAndStop(stop, trainer.accelerator)
        trainer.add_callback(stopper)
        trainer.add_callback(CompleteCheckpoints(trainer.accelerator, name))
        moves = MovesAndPhases()
        trainer.add_callback(moves)  # last: it sees the saves the callbacks above ask for
        resume = trainer.args.resume_from_checkpoint
        trainer.train(resume_from_checkpoint=loadable_checkpoint(trainer, resume) if resume else None)
        phases = moves.record(trainer.state)
        write_rank_record(trainer, phases)
        exit_code = finish(trainer, inputs, name, stopper.stopped_at, stop.signal_name, started, phases)
    watch.finish()
    return exit_code


def finish(trainer: Any, inputs: RankInputs, name: str, stopped_at: int | None, signal_name: str | None,
           started: float, phases: dict[str, Any] | None = None) -> int:
    """Save what a finished run keeps (or leave the preemption record), leave the process group together, then
    merge the adapter on rank 0 alone: a merge loads the whole base model, which can take longer than any
    collective's timeout, so no rank waits for it in a barrier."""
    from rlhf_cli.rank.engines import engine_room
    from rlhf_cli.rank.lifecycle import write_preempted
    from rlhf_cli.rank.lora import save_merged_model
    from rlhf_cli.rank.record import write_summary
    from rlhf_cli.rank.reshard import remove_resharded

    output_dir = Path(trainer.args.output_dir)
    if stopped_at is not None:
        if trainer.accelerator.is_main_process:
            write_preempted(output_dir, stopped_at, signal_name)
        status, exit_code = "preempted", EXIT_PREEMPTED
        final_save = None
    else:
        saving = time.monotonic()
        trainer.save_model(trainer.args.output_dir)
        trainer.save_state()  # trainer_state.json: the logged metrics of every step
        status, exit_code, final_save = "finished", 0, time.monotonic() - saving
    write_summary(trainer, name, status, time.monotonic() - started, phases, final_save)
    trainer.accelerator.wait_for_everyone()
    if trainer.accelerator.is_main_process:
        remove_resharded(output_dir)
        if (room := engine_room(inputs.generation().engine.spec)) is not None:
            room.remove_transfers(output_dir)
    # Destroys the process group while the interpreter is whole: left to interpreter teardown, gloo's
    # worker threads abort a finished rank now and then ("terminate called without an active exception").
    trainer.accelerator.end_training()
    if exit_code == 0 and trainer.accelerator.is_main_process:
        save_merged_model(inputs, output_dir)
    return exit_code


if __name__ == "__main__":
    from rlhf_cli.rank.watch import leave_finished

    leave_finished(main(sys.argv[1:]))  # a rank that raised leaves through Python's own exit, with its traceback
