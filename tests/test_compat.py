"""The private internals rlhf relies on still exist in the installed TRL, transformers, DeepSpeed, accelerate and
torch. Seconds, no launch: an upgrade that moves one fails here, not in a run on a GPU node."""

from __future__ import annotations

import pytest

from rlhf_cli import compat


@pytest.mark.parametrize("internal", compat.INTERNALS, ids=[internal.path for internal in compat.INTERNALS])
def test_internal_is_where_rlhf_expects_it(internal: compat.Internal) -> None:
    compat.check(internal)
    assert internal.why and internal.until


def test_a_moved_internal_is_reported_with_the_tested_versions() -> None:
    with pytest.raises(compat.InternalsChanged, match="gone.*tested with torch"):
        compat.locate("transformers:Trainer._no_such_method")
    renamed = compat.Internal("transformers:Trainer._save_checkpoint", "why", "until", ("model", "no_such_argument"))
    with pytest.raises(compat.InternalsChanged, match="no longer takes no_such_argument"):
        compat.check(renamed)


def test_every_function_here_uses_a_listed_internal() -> None:
    """A new shim must be listed, so that the test above checks it."""
    import inspect
    import re

    listed = " ".join(internal.path.replace(":", ".") for internal in compat.INTERNALS)
    source = inspect.getsource(compat).split("# -- TRL's generation context")[1]
    for private in set(re.findall(r"\.(_[a-z]\w+)\b", source)):
        assert private in listed, f"{private} is used in rlhf_cli/compat.py but not listed in INTERNALS"


def test_the_no_gather_fix_wraps_trls_generation_context() -> None:
    from rlhf_cli.gather_budget import Budget
    from rlhf_cli.rank.zero3 import install_generation_context

    original = compat.trl_generation_context()
    try:
        install_generation_context(required=True)
        wrapped = compat.trl_generation_context()
        assert wrapped is not original and wrapped.rlhf_no_gather_fix and wrapped.__wrapped__ is original
        install_generation_context(required=True, budget=Budget(fraction=0.5))  # twice: still wrapped once
        assert compat.trl_generation_context().__wrapped__ is original
    finally:
        compat.replace_trl_generation_context(original)
