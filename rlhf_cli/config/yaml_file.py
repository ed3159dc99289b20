"""Reading a YAML file a user wrote (a recipe, an accelerate config): every way it can be bad is one line
naming the file, never a traceback or a runaway.

Besides unreadable and invalid files: bytes that are not UTF-8, keys given twice (YAML keeps the last silently),
and aliases that expand to more values than any config holds (`&a [*b, *b]` nested: a few lines, billions of
values once printed or written out), or that refer to themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlhf_cli.config.paths import describe, path_state
from rlhf_cli.errors import ConfigError

MAX_VALUES = 100_000  # after aliases are expanded; a recipe holds a few hundred
MAX_BYTES = 10 * 2**20  # a recipe or accelerate config is a few KB; a chat template inline, some more
# Not libyaml's CSafeLoader: it crashes the interpreter on deeply nested input, where this one raises.
_LOADER = yaml.SafeLoader


@dataclass(frozen=True)
class YamlFile:
    values: Any
    lines: dict[str, int]  # top-level key -> 1-based line
    problems: tuple[str, ...] = ()  # found, but the values are still read (keys given twice): the caller adds theirs
    notes: tuple[str, ...] = ()  # warnings: a key given twice with one value (TRL reads the file)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _duplicate_keys(node: yaml.MappingNode, path: Path) -> tuple[list[str], list[str]]:
    """(problems, warnings): a key given again with another value is refused (YAML keeps the last silently), with
    the same value it is a warning."""
    first: dict[str, tuple[int, yaml.Node]] = {}
    problems, warnings = [], []
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        line = key.start_mark.line + 1
        if key.value in first:
            earlier, before = first[key.value]
            if _same(before, value):
                warnings.append(f"warning: {path}:{line}: `{key.value}` is given again with the same value (first "
                                f"on line {earlier}); remove one")
            else:
                problems.append(f"{path}:{line}: `{key.value}` is given again (first on line {earlier}); "
                                "YAML would keep only the last: keep one")
        first.setdefault(key.value, (line, value))
    return problems, warnings


def _same(one: yaml.Node, other: yaml.Node) -> bool:
    """Two plain values written alike (`lr: 1e-5` twice); a mapping or list is never taken for the same."""
    return isinstance(one, yaml.ScalarNode) and isinstance(other, yaml.ScalarNode) and \
        (one.tag, one.value) == (other.tag, other.value)


def check_nodes(root: yaml.Node, path: Path) -> tuple[list[str], list[str], list[str]]:
    """What stops reading (aliases that refer to themselves, more than MAX_VALUES values once aliases expand),
    then keys given twice (the file is still read, as YAML reads it, so that its other problems are found too),
    then the warnings (a key given twice with one value)."""
    duplicates: list[str] = []
    repeated: list[str] = []
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()  # the nodes on the path from the root: an alias back to one is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            in_progress.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > MAX_VALUES:
                return [f"{path}:{node.start_mark.line + 1}: YAML aliases (*name) expand to more than {MAX_VALUES} "
                        "values here; write the values out"], duplicates, repeated
            continue
        if key in sizes:
            continue
        if key in in_progress:
            return [f"{path}:{node.start_mark.line + 1}: a YAML alias refers to a value that contains it"], \
                duplicates, repeated
        in_progress.add(key)
        if isinstance(node, yaml.MappingNode):
            problems, warnings = _duplicate_keys(node, path)
            duplicates += problems
            repeated += warnings
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    return [], duplicates, repeated


def _text(path: Path, what: str) -> str:
    state = path_state(path)
    if state.kind != "file":
        raise ConfigError(describe(path, state, what))
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the {what} ({error.strerror or error})") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES // 2**20} MiB, which no {what} is (a few KB); is it the "
                          f"right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[error.start]:02x}); save the {what} as "
                          "UTF-8") from None


def read_yaml(path: Path, what: str) -> YamlFile:
    """The values of a YAML file, or ConfigError with every problem found in it."""
    text = _text(path, what)
    try:
        loader = _LOADER(text)  # it checks every character first
    except yaml.reader.ReaderError as error:
        line = text.count("\n", 0, error.position) + 1
        raise ConfigError(f"{path}:{line}: a control character (U+{error.character:04X}) YAML does not allow; "
                          f"remove it (is the {what} a text file?)") from None
    try:
        node = loader.get_single_node()
        fatal, duplicates, repeated = check_nodes(node, path) if node is not None else ([], [], [])
        if fatal:
            raise ConfigError(*fatal)  # the values cannot be read: nothing else about them is known
        values = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a {what}") from None
    finally:
        loader.dispose()
    lines = {}
    if isinstance(node, yaml.MappingNode):
        lines = {key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}
    return YamlFile(values, lines, tuple(duplicates), tuple(repeated))
