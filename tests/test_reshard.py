"""A checkpoint staged for another process count (rlhf_cli/rank/reshard.py), without DeepSpeed's conversion: each
rank that exists in both runs keeps its own random numbers, the rest of the checkpoint is read where it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import write
from rlhf_cli.output.run_dir import MANIFEST
from rlhf_cli.rank import reshard


def saved_by(processes: int, root: Path) -> Path:
    checkpoint = root / "checkpoint-4"
    write(checkpoint / "trainer_state.json", '{"global_step": 4}')
    write(checkpoint / MANIFEST, "{}")
    names = [f"rng_state_{rank}.pth" for rank in range(processes)] if processes > 1 else ["rng_state.pth"]
    for rank, name in enumerate(names):
        write(checkpoint / name, f"rank {rank}")
    return checkpoint


@pytest.mark.parametrize(("saved", "processes", "states"), [
    (2, 1, {"rng_state.pth": "rank 0"}),
    (4, 2, {"rng_state_0.pth": "rank 0", "rng_state_1.pth": "rank 1"}),
    (1, 2, {"rng_state_0.pth": "rank 0"}),  # rank 1 is new: it starts from the seed
])
def test_each_remaining_rank_keeps_its_random_numbers(saved: int, processes: int, states: dict[str, str],
                                                      tmp_path: Path) -> None:
    source = saved_by(saved, tmp_path)
    staged = tmp_path / "out" / "ranks" / "resharded" / "checkpoint-4"
    reshard._stage(source, staged, saved, processes, universal=False)
    assert {path.name: path.read_text() for path in staged.glob("rng_state*")} == states
    assert (staged / "trainer_state.json").resolve() == source / "trainer_state.json"  # read where it is
    assert not (staged / MANIFEST).exists() and (staged / reshard.DONE).is_file()
    reshard.remove_resharded(tmp_path / "out")
    assert not staged.parent.exists() and (source / "trainer_state.json").is_file()
