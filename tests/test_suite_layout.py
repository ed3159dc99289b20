"""The suite's own structure: what several test files share is defined once, in tests/helpers.py or a conftest,
and no test file imports another (a test file is collected, and its fixtures and parametrized names leak)."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

TESTS = REPO / "tests"


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def _imported_modules(tree: ast.AST) -> set[str]:
    """Every module a file imports, at any depth of its code."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _functions(tree: ast.Module) -> dict[str, str]:
    """Each top-level helper (a function or class that is not a test) by its code, whatever it is called and says
    of itself: name -> code."""
    constants = {target.id: ast.dump(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)}
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("test_"):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            args = ast.dump(node.args) if isinstance(node, ast.FunctionDef) else ""
            read = sorted({name.id for name in ast.walk(node) if isinstance(name, ast.Name) and name.id in constants})
            # The module's constants it reads belong to its code: two fixtures running two scripts differ.
            found[node.name] = args + "".join(ast.dump(statement) for statement in body) + \
                "".join(constants[name] for name in read)
    return found


def _calls_to(tree: ast.AST, attribute: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == attribute]


def _asks_for_vllm(call: ast.Call) -> bool:
    return bool(call.args) and isinstance(call.args[0], ast.Constant) and call.args[0].value == "vllm"


def _binds_any_port(call: ast.Call) -> bool:
    """`sock.bind((host, 0))`: the system picks a free port."""
    address = call.args[0] if call.args else None
    return isinstance(address, ast.Tuple) and isinstance(address.elts[-1], ast.Constant) and address.elts[-1].value == 0


def test_no_test_file_imports_another() -> None:
    """What is shared goes into tests/helpers.py, a fixture into a conftest."""
    test_modules = {path.stem for path in _test_files()}
    importing = {str(path.relative_to(TESTS)): sorted(name for name in _imported_modules(ast.parse(path.read_text()))
                                                      if name.split(".")[-1] in test_modules
                                                      or name.startswith("launch."))
                 for path in _test_files()}
    assert {name: imported for name, imported in importing.items() if imported} == {}


def test_the_shared_helpers_are_defined_once() -> None:
    """No function is written twice in the suite, no test file skips on vLLM's absence by itself or binds a free
    port of its own: one `needs_vllm`, one `free_port`, in tests/helpers.py."""
    where: dict[str, list[str]] = {}
    own_markers, own_ports = [], []
    for path in [*_test_files(), TESTS / "helpers.py", *TESTS.rglob("conftest.py")]:
        tree = ast.parse(path.read_text())
        name = str(path.relative_to(TESTS))
        for function, code in _functions(tree).items():
            where.setdefault(code, []).append(f"{name}:{function}")
        if path.name == "helpers.py":
            continue
        if any(_asks_for_vllm(call) for call in _calls_to(tree, "find_spec")):
            own_markers.append(name)
        if any(_binds_any_port(call) for block in ast.walk(tree) if isinstance(block, ast.With)
               for call in _calls_to(block, "bind")):  # bound and closed at once: a free port
            own_ports.append(name)
    twice = [places for places in where.values() if len(places) > 1]
    assert (twice, own_markers, own_ports) == ([], [], [])


SHARING_BY_HAND = '''
from test_plan import seed_run
import launch.test_operations
import importlib.util


def free_port():
    """A port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))


def port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))


marker = importlib.util.find_spec("vllm")
'''


def test_the_checks_see_what_they_look_for() -> None:
    """The checks above read what they should: an import of a test file, one function under two names and two
    docstrings, a vLLM marker and a port of a file's own; a port chosen by the caller is not a free port's helper."""
    tree = ast.parse(SHARING_BY_HAND)
    assert {"test_plan", "launch.test_operations"} <= _imported_modules(tree)
    assert _functions(tree)["free_port"] == _functions(tree)["port"]
    assert [_asks_for_vllm(call) for call in _calls_to(tree, "find_spec")] == [True]
    assert [_binds_any_port(call) for call in _calls_to(tree, "bind")] == [True, True]
    assert not _binds_any_port(_calls_to(ast.parse("server.bind(('127.0.0.1', 8000))"), "bind")[0])
