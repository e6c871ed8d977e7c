"""The package layering (see malletrain/__init__.py), checked on the source.

core/ must stay pure so the daemon and the simulator share it unchanged.
"""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "malletrain"

#: package -> malletrain packages it may import (besides itself, errors and the root).
ALLOWED = {
    "core": set(),
    "slurm": {"core"},
    "sim": {"core"},
    "elastic": set(),
    "ops": {"core"},
    "daemon": {"core", "slurm", "elastic", "ops"},
}


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
        for name in names:
            parts = name.split(".")
            if parts[0] == "malletrain" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_lower_layers(package):
    allowed = ALLOWED[package] | {package, "errors", "__init__"}
    bad = []
    for path in sorted((PKG / package).rglob("*.py")):
        for imported in _imports(path):
            if imported not in allowed and imported != "cli":
                bad.append(f"{path.relative_to(PKG)} imports malletrain.{imported}")
    assert not bad, "layering violations:\n" + "\n".join(bad)


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
