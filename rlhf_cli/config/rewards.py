"""Reward functions (and the other code a recipe names: tools, environments) checked without running them.

`file.py:function` is parsed (not imported: importing runs the user's code, which may load torch, print, or hang):
a syntax error or a missing function is found here with its line. `package.module:function` is looked up on the
path the ranks will have. Importing each one and checking that it takes TRL's arguments happens once more before
launch, in a separate process with a time limit (rlhf_cli/rank/prelaunch.py).
"""

from __future__ import annotations

import ast
import sys
from importlib.machinery import PathFinder
from pathlib import Path

from rlhf_cli.config.paths import describe, path_state


class RewardSpecError(ValueError):
    """What is wrong with one `reward_funcs` entry; the message says what to write instead."""


def _defined_names(tree: ast.Module) -> set[str] | None:
    """Names bound at the top level of a module, or None when they cannot be known without running it."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif not isinstance(node, (ast.Expr, ast.Pass)):
            return None  # `if`, `try`, `for`, `with` at the top level may bind anything
    return None if "__getattr__" in names else names


def check_file_function(path: Path, function: str) -> None:
    """`path` parses as Python and defines `function` at its top level."""
    try:
        source = path.read_bytes()
        tree = ast.parse(source, filename=str(path))
    except OSError as error:
        raise RewardSpecError(f"{path}: cannot read it ({error.strerror or error})") from None
    except SyntaxError as error:
        line = f":{error.lineno}" if error.lineno else ""
        raise RewardSpecError(f"{path}{line}: syntax error ({error.msg}); fix the file") from None
    except ValueError as error:  # null bytes, an undecodable file
        raise RewardSpecError(f"{path}: not Python source ({error})") from None
    names = _defined_names(tree)
    if names is not None and function not in names:
        defined = sorted(name for name in names if not name.startswith("_"))
        listed = f" (it defines: {', '.join(defined[:8])})" if defined else ""
        raise RewardSpecError(f"{path} defines no `{function}`{listed}; write {path.name}:FUNCTION with one of them")


def check_module(module: str, cwd: Path) -> None:
    """The top-level package of `module` is importable by the ranks: installed, or in the working directory."""
    top = module.split(".")[0]
    if not top.isidentifier():
        raise RewardSpecError(f"{module!r} is not a module name; write package.module:function or file.py:function")
    if top not in sys.builtin_module_names and PathFinder.find_spec(top, [str(cwd), *sys.path]) is None:
        raise RewardSpecError(f"module `{top}` is not importable here (not installed, and not in {cwd}); install "
                              "it, or give its file: path/to/file.py:function")


def locate_reward(spec: str, trl_names: tuple[str, ...], base_dirs: tuple[Path, ...], cwd: Path) -> str:
    """The entry with a file made absolute; RewardSpecError when it cannot work."""
    target, colon, function = spec.rpartition(":")
    if not colon:
        if spec.endswith(".py"):
            raise RewardSpecError(f"{spec!r} names a file but no function: write {spec}:FUNCTION")
        if "." not in spec:
            if spec not in trl_names:
                raise RewardSpecError(f"{spec!r} is not one of TRL's ({', '.join(trl_names)}); write "
                                      "module:function or file.py:function")
            return spec
        check_module(spec.rpartition(".")[0], cwd)  # TRL's style: package.module.function
        return spec
    return locate_code(spec, base_dirs, cwd)


def locate_code(spec: str, base_dirs: tuple[Path, ...], cwd: Path, kind: str = "function") -> str:
    """`file.py:name` (the file made absolute, relative to the first of `base_dirs` that holds it) or
    `package.module:name`, checked without running it; RewardSpecError when it cannot work. `kind` names what
    `name` is in the messages (a function, a class)."""
    target, colon, name = spec.rpartition(":")
    if not colon:
        ending = f"{spec}:{kind.upper()}" if spec.endswith(".py") else f"file.py:{kind} or package.module:{kind}"
        raise RewardSpecError(f"{spec!r} names no {kind}: write {ending}")
    if not target or not name.isidentifier():
        raise RewardSpecError(f"{spec!r}: write file.py:{kind} or package.module:{kind}")
    if not target.endswith(".py"):
        check_module(target, cwd)
        return spec
    path = Path(target).expanduser()
    candidates = [path] if path.is_absolute() else [base / path for base in base_dirs]
    states = [(candidate, path_state(candidate)) for candidate in candidates]
    found = next((candidate for candidate, state in states if state.kind == "file"), None)
    if found is None:
        candidate, state = next(((c, s) for c, s in states if s.kind != "missing" or s.reason), (target, None))
        raise RewardSpecError(describe(candidate, state, "Python file") if state else f"file {target} not found")
    found = found.resolve()
    check_file_function(found, name)
    return f"{found}:{name}"
