"""TRL's `str` fields with a fixed set of values (rlhf_cli/schema/choices.yaml) hold exactly the values TRL's
source tells apart, and every such field is in the table: read from the installed TRL, not copied from it."""

from __future__ import annotations

import ast
import importlib.util
import json
from collections import defaultdict

import pytest

from rlhf_cli.config.fields import FieldTypeError, catalogue, coerce, fixed_choices
from rlhf_cli.schema import snapshot

# Where each algorithm's TRL trainer and config live; PPO is rlhf's own (its choices are in its snapshot).
TRL_SOURCES = {"grpo": ("trl.trainer.grpo_trainer", "trl.trainer.grpo_config"),
               "rloo": ("trl.trainer.rloo_trainer", "trl.trainer.rloo_config"),
               "online_dpo": ("trl.experimental.online_dpo.online_dpo_trainer",
                              "trl.experimental.online_dpo.online_dpo_config")}
# Compared with one special value only, which is not a choice: any other value means something else.
NOT_A_CHOICE = {"pad_to_multiple_of"}  # "auto", else a number


def compared_values(algorithm: str) -> dict[str, set[str]]:
    """field -> the strings TRL's trainer and config compare `<obj>.field` with (==, !=, in, not in)."""
    shipped = json.loads((snapshot.SCHEMA_DIR / f"{algorithm}.json").read_text())  # = TRL's: test_schema_snapshot
    plain = {name for name, spec in shipped["fields"].items() if "str" in spec["kinds"] and "choices" not in spec}
    found: dict[str, set[str]] = defaultdict(set)
    for module in TRL_SOURCES[algorithm]:
        origin = importlib.util.find_spec(module).origin
        for node in ast.walk(ast.parse(open(origin).read())):
            if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr in plain):
                continue
            for compared in node.comparators:
                items = compared.elts if isinstance(compared, (ast.List, ast.Tuple, ast.Set)) else [compared]
                found[node.left.attr] |= {item.value for item in items
                                          if isinstance(item, ast.Constant) and isinstance(item.value, str)}
    return {name: values for name, values in found.items() if values}  # `is None` compares no string


@pytest.mark.parametrize("algorithm", sorted(TRL_SOURCES))
def test_each_fixed_set_is_what_trl_tells_apart_and_none_is_missing(algorithm: str) -> None:
    compared = compared_values(algorithm)
    fields = catalogue(algorithm)
    for name, values in compared.items():
        if name not in NOT_A_CHOICE:
            assert name in fixed_choices(), f"{name}: TRL compares it with {sorted(values)}; add it to choices.yaml"
            assert set(fixed_choices()[name]) == values, name
            assert fields[name].choices == tuple(fixed_choices()[name])
            assert fields[name].default in values  # TRL's own default is one of them
    for name in fixed_choices():
        if name in fields and name not in compared:  # typed as a choice already (online DPO's loss_type), or absent
            assert fields[name].choices is not None


def test_a_value_trl_would_die_of_is_refused_with_the_closest(tmp_path) -> None:
    field = catalogue("grpo")["loss_type"]
    with pytest.raises(FieldTypeError, match="got 'dr_grp'; did you mean dr_grpo"):
        coerce(field, "dr_grp")
    assert coerce(catalogue("online_dpo")["loss_type"], "ipo") == "ipo"  # its own Literal, untouched
    assert json.loads(json.dumps(fixed_choices())) == fixed_choices()  # plain strings only
