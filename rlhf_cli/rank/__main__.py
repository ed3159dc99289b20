"""Entry point of every rank: `python -m rlhf_cli.rank ALGORITHM RECIPE`, started by accelerate.

It reads the resolved recipe the launcher wrote and never sees the user's command line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlhf_cli.rank.inputs import RankInputs


def main(argv: list[str]) -> None:
    algorithm, recipe_path = argv
    inputs = RankInputs.read(algorithm, Path(recipe_path))

    from rlhf_cli.rank.builders import BUILDERS
    from rlhf_cli.rank.record import write_rank_record
    from rlhf_cli.rank.zero3 import install_no_gather_fix

    install_no_gather_fix(required=inputs.trainer.get("ds3_gather_for_generation") is False)
    trainer = BUILDERS[algorithm](inputs)
    trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
    trainer.save_model(trainer.args.output_dir)
    trainer.save_state()  # trainer_state.json: the logged metrics of every step
    write_rank_record(trainer)
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1:])
