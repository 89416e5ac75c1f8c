"""The package's import arrows run one way (README, "Architecture"):

- `lucid/milp` (the neutral model and its encodings) imports neither `lucid/bounds` nor anything
  that computes bounds, solves or schedules: bounds reach it as plain arrays;
- nothing outside `lucid/bab` and the command line imports `lucid/bab` (the engine sits on top);
- only `lucid/solvers` imports solver packages (highspy, gurobipy, pulp, pyscipopt).

Read from the source (every `import` statement, also the ones inside functions), so a lazy import
cannot hide an arrow that runs back up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "lucid"
SOLVER_PACKAGES = {"highspy", "gurobipy", "pulp", "pyscipopt"}


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules() -> dict[str, set[str]]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        out[str(path.relative_to(ROOT.parent).with_suffix("")).replace("/", ".")] = imports_of(path)
    return out


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("module, imports", sorted(modules().items()))
def test_import_arrows_run_one_way(module, imports):
    if _under(module, "lucid.milp"):
        upward = [i for i in imports if _under(i, "lucid") and not _under(i, "lucid.milp")
                  and not _under(i, "lucid.errors") and not _under(i, "lucid.atomic")]
        assert not upward, f"{module} (the neutral MILP) imports {sorted(upward)}"
    if not (_under(module, "lucid.bab") or _under(module, "lucid.cli")):
        assert not [i for i in imports if _under(i, "lucid.bab")], f"{module} imports the engine"
    if not _under(module, "lucid.solvers"):
        solver_imports = {i.split(".")[0] for i in imports} & SOLVER_PACKAGES
        assert not solver_imports, f"{module} imports solver packages {sorted(solver_imports)}"


def test_the_checker_sees_lazy_imports(tmp_path):
    """A function-level import counts like a module-level one (the rule would be empty otherwise)."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    import highspy\n    from lucid.bab.engine import Engine\n")
    assert {"highspy", "lucid.bab.engine", "lucid.bab.engine.Engine"} <= imports_of(source)
