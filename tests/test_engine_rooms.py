"""Where an engine is named: vLLM appears (case-insensitively, in code: names and strings, not comments or
docstrings) only in the engine rooms: the registry (rlhf_cli/generation/engines.py), each layer's `engines/`
folder, `compat/`, the CLI and the algorithm registry. A new engine then lands in those rooms, not across the tree.
"""

from __future__ import annotations

import ast
import io
import tokenize

from helpers import REPO, docstring_lines

PACKAGE = REPO / "rlhf_cli"
ROOMS = ("generation/engines.py", "config/engines/", "plan/engines/", "rank/engines/", "compat/", "cli/",
         "algorithms/")


def mentions(text: str, word: str) -> int:
    """How many names and string literals of a module's code contain `word` (any case); comments and docstrings
    do not count."""
    skip = docstring_lines(ast.parse(text))
    return sum(1 for token in tokenize.generate_tokens(io.StringIO(text).readline)
               if token.type in (tokenize.NAME, tokenize.STRING) and word in token.string.lower()
               and token.start[0] not in skip)


def named_outside_the_rooms(word: str) -> dict[str, int]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not relative.startswith(ROOMS) and (count := mentions(path.read_text(), word)):
            found[relative] = count
    return found


def test_vllm_is_named_only_in_the_engine_rooms() -> None:
    assert named_outside_the_rooms("vllm") == {}, \
        "vLLM named outside generation/engines.py and the engines/ folders: move the code there"


def test_the_count_sees_code_and_skips_comments_and_docstrings() -> None:
    text = ('"""vLLM here is a docstring."""\n# vllm in a comment\nuse_vllm = "vLLM colocate"\n\n\n'
            'def sync():\n    """Into vLLM."""\n    return VLLM  # vllm\n')
    assert mentions(text, "vllm") == 3  # use_vllm, "vLLM colocate", VLLM
