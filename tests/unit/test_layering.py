"""The package layering (see docs/architecture.md), checked on the source.

core/ must stay pure so the daemon and the simulator share it unchanged. The elastic and
daemon packages are split into rooms by role; each room may import only the rooms listed for
it, so a new upward or sideways arrow fails here, naming the file.
"""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "malletrain"

#: room -> malletrain rooms it may import (besides itself, errors and the package root).
ALLOWED = {
    "core": set(),
    "slurm": {"core"},
    "sim": {"core"},
    "ops": {"core"},
    "elastic.protocol": set(),
    "elastic.training": set(),
    "elastic.coordinator": {"elastic.protocol"},
    "elastic.worker": {"elastic.protocol", "elastic.training"},
    "elastic.restart": {"elastic.protocol"},
    "daemon.jobs": {"core", "slurm", "elastic.restart"},
    "daemon.tick": {"core", "daemon.jobs"},
    "daemon.act": {"core", "slurm", "ops", "daemon.jobs", "daemon.tick"},
    "daemon.observe": {
        "core",
        "daemon.jobs",
        "daemon.tick",
        "elastic.coordinator",
        "elastic.protocol",
    },
    "daemon.submit": {"core", "slurm", "ops", "daemon.jobs", "elastic.restart"},
    "daemon.service": {
        "core",
        "slurm",
        "ops",
        "daemon.jobs",
        "daemon.tick",
        "daemon.act",
        "daemon.observe",
        "daemon.submit",
        "elastic.coordinator",
    },
}
#: No room holds more modules than a newcomer scans at a glance.
MAX_ROOM_MODULES = 15


def _room(module: str) -> str:
    """``malletrain.daemon.jobs.spec`` -> ``daemon.jobs``; a root module -> its own name."""
    rel = module.removeprefix("malletrain.")
    for room in sorted(ALLOWED, key=len, reverse=True):
        if rel == room or rel.startswith(room + "."):
            return room
    return rel.split(".")[0]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found.update(_room(n) for n in names if n.startswith("malletrain."))
    return found


def _room_files(room: str) -> list[Path]:
    return sorted((PKG / room.replace(".", "/")).rglob("*.py"))


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_room_imports_only_allowed_rooms(room):
    allowed = ALLOWED[room] | {room, "errors", "cli"}
    bad = [
        f"{path.relative_to(PKG)} imports malletrain.{imported}"
        for path in _room_files(room)
        for imported in sorted(_imports(path) - allowed)
    ]
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_every_module_is_in_a_room():
    """A module straight under elastic/ or daemon/ would escape the rules above."""
    stray = [
        str(path.relative_to(PKG))
        for pkg in ("elastic", "daemon")
        for path in (PKG / pkg).glob("*.py")
        if path.name != "__init__.py"
    ]
    assert not stray, stray


def test_rooms_stay_small():
    big = []
    for folder in sorted({p.parent for p in PKG.rglob("*.py")}):
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_ROOM_MODULES:
            big.append(f"{folder.relative_to(PKG)}: {len(modules)} modules")
    assert not big, big


def test_the_room_of_a_module():
    assert _room("malletrain.daemon.jobs.spec") == "daemon.jobs"
    assert _room("malletrain.elastic.protocol") == "elastic.protocol"
    assert _room("malletrain.errors") == "errors"


def test_core_does_no_io():
    banned = {"subprocess", "socket", "sqlite3", "requests", "torch"}
    bad = []
    for path in sorted((PKG / "core").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module.split(".")[0]]
            else:
                continue
            bad += [f"{path.name}: {m}" for m in mods if m in banned]
    assert not bad, bad


# -- the shape of the tree: no import circle, rooms and functions of a readable size -------

#: Functions deliberately over 60 lines, each with its reason in a comment above it.
LONG_FUNCTIONS = {
    "sim/bounds/bound_milp.py:integer_finish_bound",
    "core/allocation/valuation.py:job_value_table",
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _module_graph() -> dict[str, set[str]]:
    """malletrain module -> the malletrain modules it imports (anywhere in the file)."""
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    """Imports inside functions and under TYPE_CHECKING count too: a circle is a circle."""
    assert _cycles(_module_graph()) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_modules_and_functions_stay_readable():
    too_long = []
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(PKG))
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{rel}: {text.count(chr(10))} lines (max {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in LONG_FUNCTIONS:
                    too_long.append(f"{rel}:{node.name}: {n} lines (max {MAX_FUNCTION_LINES})")
    assert not too_long, "\n".join(too_long)
