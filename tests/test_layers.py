"""The core's house rules, read from its imports (module-level and deferred alike): layers call
downward only, no module imports itself back through others, and no module outgrows a reading.

The floors, bottom up (docs/development.md, "Layout of the code"); a room may import its own modules and the floors below,
never a room beside it or above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import singerlake

PACKAGE = Path(singerlake.__file__).parent
FLOORS = [
    {"errors"},
    {"pause", "times", "text"},
    {"storage"},
    {"format"},
    {"settings", "spark"},
    {"commits", "changes"},
    {"files"},
    {"lake"},
    {"landing", "replay"},
    {"sources"},
    {"tables"},
    {"jobs"},
    {"site"},
    {""},  # the package root: the public API
    {"cli"},
]
MAX_MODULE_LINES = 450
MAX_JOBS_LINES = 1200


def module_name(path: Path) -> str:
    parts = ["singerlake", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported(name: str, path: Path) -> dict[str, int]:
    """The core modules ``name`` imports anywhere in its text (and names as an exact string), with a line each."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "singerlake":
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([node.module] if node.module else []))
            if base.split(".")[0] != "singerlake":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in MODULES else base, node.lineno)
        elif isinstance(node, ast.Constant) and node.value in MODULES and "." in node.value:
            add(node.value, node.lineno)  # importlib.import_module("singerlake.x") and the like
    return found


GRAPH = {name: imported(name, path) for name, path in MODULES.items()}


def room(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def floor(name: str) -> int:
    return next(i for i, rooms in enumerate(FLOORS) if room(name) in rooms)


def test_every_module_lives_on_a_floor():
    assert [name for name in MODULES if not any(room(name) in rooms for rooms in FLOORS)] == []


def test_imports_run_downward_or_within_a_room():
    wrong = [
        f"{name}:{line} imports {target} ({room(target) or 'the root'} is not below {room(name) or 'the root'})"
        for name, targets in GRAPH.items()
        for target, line in targets.items()
        if room(target) != room(name) and floor(target) >= floor(name)
    ]
    assert wrong == []


def test_no_module_imports_itself_back():
    circles = []
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in GRAPH[name]:
            if state.get(target) == "open":
                circles.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert circles == []


def test_modules_stay_short_and_the_lake_jobs_stay_few():
    lines = {name: len(path.read_text("utf-8").splitlines()) for name, path in MODULES.items()}
    assert {name: n for name, n in lines.items() if n > MAX_MODULE_LINES} == {}
    assert sum(n for name, n in lines.items() if room(name) == "jobs") < MAX_JOBS_LINES


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The rules above can fail: an import upward, and a circle, in a module of their own."""
    path = tmp_path / "bad.py"
    path.write_text("from singerlake.cli.main import main\nimport singerlake.tables.project\n")
    found = imported("singerlake.storage.bad", path)
    assert found == {"singerlake.cli.main": 1, "singerlake.tables.project": 2}
    assert all(floor(target) > floor("singerlake.storage.bad") for target in found)


ERROR_HOMES = {"singerlake.errors", "singerlake.lake", "singerlake.storage.base"}  # and each room's errors.py


def test_every_error_is_a_singerlake_error_named_once_in_its_rooms_errors_module():
    import importlib

    from singerlake.errors import SingerlakeError

    defined: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text("utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                cls = getattr(importlib.import_module(name), node.name)
                if isinstance(cls, type) and issubclass(cls, BaseException):
                    defined.setdefault(node.name, []).append(name)
                    assert issubclass(cls, SingerlakeError), f"{name}.{node.name} is not a SingerlakeError"
                    assert name in ERROR_HOMES or name.endswith(".errors"), f"{name}.{node.name} is outside its room's errors module"
    assert {error: homes for error, homes in defined.items() if len(homes) > 1} == {}
    assert len(defined) > 20  # the walk saw the errors
