"""`rlhf recipes`: every bundled recipe listed once, with what it is for."""

from __future__ import annotations

import json

from helpers import RECIPES


def test_every_bundled_recipe_is_listed_with_its_purpose(cli) -> None:
    listed = json.loads(cli("recipes", "--json").stdout)
    on_disk = sorted(f"{p.parent.name}/{p.stem}" for p in RECIPES.glob("*/*.yaml"))
    assert sorted(r["name"] for r in listed) == on_disk
    for recipe in listed:
        first_line = (RECIPES / f"{recipe['name']}.yaml").read_text().splitlines()[0]
        assert first_line == f"# {recipe['purpose']}" and len(recipe["purpose"]) > 20, recipe
        assert recipe["algorithm"] == recipe["name"].split("/")[0].replace("_", "-")
    smoke = next(r for r in listed if r["name"] == "rloo/smoke")
    assert smoke["model"] == "smoke/policy"


def test_the_table_names_each_recipe_its_algorithm_and_model(cli) -> None:
    result = cli("recipes")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "(for", "-r)", "ALGORITHM", "MODEL"]
    assert "ppo/pythia-12b-descriptiveness ppo EleutherAI/pythia-12b" in [" ".join(line.split()) for line in lines]
