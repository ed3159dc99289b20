"""Where an engine is named: vLLM appears (case-insensitively, in code: names and strings, not comments or
docstrings) only in the engine rooms: the registry (rlhf_cli/generation/engines.py), each layer's `engines/`
folder, `compat/`, the CLI and the algorithm registry. A new engine then lands in those rooms, not across the tree.
TRL's keys that choose how a run generates are spelled only where the choice is read and written: `config/`,
`generation/` and the flag table; every other module goes through their constants or the registry.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator

from helpers import REPO, docstring_lines
from rlhf_cli.generation.choice import GATHER_KEY
from rlhf_cli.generation.engines import USE_VLLM_KEY, VLLM_MODE_KEY

PACKAGE = REPO / "rlhf_cli"
ROOMS = ("generation/engines.py", "config/engines/", "plan/engines/", "rank/engines/", "compat/", "cli/",
         "algorithms/")
GENERATION_KEYS = (GATHER_KEY, USE_VLLM_KEY, VLLM_MODE_KEY)
KEY_ROOMS = ("config/", "generation/", "cli/flags.py")


def code_tokens(text: str) -> Iterator[str]:
    """The names and string literals of a module's code; comments and docstrings are not code."""
    skip = docstring_lines(ast.parse(text))
    return (token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
            if token.type in (tokenize.NAME, tokenize.STRING) and token.start[0] not in skip)


def mentions(text: str, word: str) -> int:
    """How many names and string literals of a module's code contain `word` (any case)."""
    return sum(1 for token in code_tokens(text) if word in token.lower())


def spelled(text: str, key: str) -> int:
    """How many names and string literals of a module's code spell `key` as a whole word (`vllm_mode`, not
    `vllm_model`)."""
    return sum(1 for token in code_tokens(text) if re.search(rf"\b{key}\b", token))


def found_outside(rooms: tuple[str, ...], count) -> dict[str, int]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not relative.startswith(rooms) and (number := count(path.read_text())):
            found[relative] = number
    return found


def test_vllm_is_named_only_in_the_engine_rooms() -> None:
    assert found_outside(ROOMS, lambda text: mentions(text, "vllm")) == {}, \
        "vLLM named outside generation/engines.py and the engines/ folders: move the code there"


def test_trls_generation_keys_are_spelled_only_in_config_generation_and_the_flag_table() -> None:
    assert found_outside(KEY_ROOMS, lambda text: sum(spelled(text, key) for key in GENERATION_KEYS)) == {}, \
        "a TRL generation key spelled outside config/, generation/ and cli/flags.py: use its constant"


def test_the_count_sees_code_and_skips_comments_and_docstrings() -> None:
    text = ('"""vLLM here is a docstring."""\n# vllm in a comment\nuse_vllm = "vLLM colocate"\n\n\n'
            'def sync():\n    """Into vLLM."""\n    return VLLM  # vllm\n')
    assert mentions(text, "vllm") == 3  # use_vllm, "vLLM colocate", VLLM
    assert spelled(text + 'args.vllm_model_impl, f"`vllm_mode: server`"\n', "vllm_mode") == 1
    assert spelled(text, "use_vllm") == 1
