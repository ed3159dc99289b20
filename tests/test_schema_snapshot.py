"""The field catalogue the CLI validates against must match the TRL that is installed."""

from __future__ import annotations

import json

from rlhf_cli.schema import snapshot
from rlhf_cli.config.fields import catalogue


def test_snapshot_matches_installed_trl() -> None:
    for algorithm, current in snapshot.build().items():
        shipped = json.loads((snapshot.SCHEMA_DIR / f"{algorithm}.json").read_text())
        assert shipped == json.loads(json.dumps(current)), (
            f"rlhf_cli/schema/{algorithm}.json is stale for trl {current['trl_version']}: "
            "run `python -m rlhf_cli.schema.snapshot`")


def test_catalogue_has_trl_fields_and_ours() -> None:
    fields = catalogue("online_dpo")
    assert fields["max_new_tokens"].group == "trainer" and fields["max_new_tokens"].kinds == ("int",)
    assert fields["model_name_or_path"].group == "model"
    assert fields["reward_funcs"].group == "script"
    assert fields["offload_optimizer"].choices == ("none", "cpu", "nvme")
    assert fields["stage3_prefetch_bucket_size"].group == "zero3"
