"""The field catalogue the CLI validates against must match the TRL that is installed."""

from __future__ import annotations

import json

from rlhf_cli.config.fields import catalogue, coerce
from rlhf_cli.schema import snapshot


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


def test_every_range_names_a_real_key_and_admits_its_default() -> None:
    """A typo in ranges.yaml would check nothing; a range that refuses TRL's own default would refuse every run."""
    from rlhf_cli.algorithms import ALGORITHMS
    from rlhf_cli.config.fields import generation_fields, ranges, snapshot_list

    known = set().union(*(catalogue(name) for name in ALGORITHMS))
    assert set(ranges()["fields"]) <= known
    assert set(generation_fields()) <= set(snapshot_list("rloo", "generation_keys"))
    assert {key for rule in ranges()["cross_field"] for key in rule["when"]} <= known
    for name in ALGORITHMS:
        for field in catalogue(name).values():
            if field.limits is not None and field.default is not None:
                assert coerce(field, field.default) == field.default, (name, field.name)
