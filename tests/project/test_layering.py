"""The package's import arrows run one way (docs/architecture.md, "Layering"):

- every module of `lucid` sits in one layer of `LAYERS`, and imports only its own layer or lower
  ones: data flows run dir -> problem -> node analysis -> MILP model -> backend -> engine ->
  bounds.json -> access, and the foundations under it know nothing of what is built on them;
- `lucid/milp` (the neutral model and its encodings) imports neither `lucid/bounds` nor anything
  that computes bounds, solves or schedules: bounds reach it as plain arrays;
- nothing outside the engine's layers (`lucid/bab`, the region modules that run it, and the
  verification runs of `lucid/verify` that drive it) and the command line imports them (the engine
  sits on top);
- nothing outside `lucid/cli` (and `lucid/__main__.py`, which runs it) imports `lucid/cli`: another
  entry point such as `python -m lucid.baselines` takes what it shares with `lucid` from below;
- only `lucid/solvers` imports solver packages (highspy, gurobipy, pulp, pyscipopt).

Read from the source (every `import` statement, also the ones inside functions), so a lazy import
cannot hide an arrow that runs back up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "lucid"
SOLVER_PACKAGES = {"highspy", "gurobipy", "pulp", "pyscipopt"}
# The region package's modules that run verification sit with the engine; the partition itself
# (`regions`, `regions.tree`, `regions.reader`, `regions.lookup`) sits beside the run directory, for the access layer.
ENGINE_REGIONS = {"regions.one_box", "regions.choice", "regions.log_view"}
# Lowest first. A module's layer is that of the longest name here that holds it (a package, a module,
# or a module inside a package, as "regions.one_box"); any `__main__` module is a command line and
# sits on top.
LAYERS = [
    {"__init__", "__version__", "errors", "command_errors", "option_fields", "atomic", "worker_inputs", "cluster", "adam", "deadline"},  # foundations
    {"network", "convolution", "network_cache", "data", "rundir", "regions", "hyper", "witness",
     "dynamic_range", "residual"},  # networks and run directories; the partition into regions
    {"interop"},  # ONNX / state-dict import and export of run directories, VNN-LIB queries
    {"milp"},  # the solver-neutral model
    {"solvers"},  # backends
    {"bounds"},  # bound propagation, LPs, ReLU splitting
    {"settings"},  # the typed settings objects
    {"analysis", "agt", "training", "sgd", "residual_choice"},  # a node's analysis and encoding; AGT boxes; training; T's step; choosing M
    {"bab", *ENGINE_REGIONS},  # the branch-and-bound engine; one region box's verification
    {"verify"},  # a verification run: its lifecycle and the strategies it drives
    {"access"},  # label-only access
    {"report", "baselines"},  # reports and the baselines
    {"cli", "__main__"},  # command lines
]


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


def layer_of(module: str) -> int:
    parts = module.split(".")
    if parts[-1] == "__main__":
        return len(LAYERS) - 1
    inside = parts[1:] or parts
    for length in range(len(inside), 0, -1):
        name = ".".join(inside[:length])
        for rank, names in enumerate(LAYERS):
            if name in names:
                return rank
    raise AssertionError(f"{module} is in no layer of LAYERS: add it where it belongs")


def in_engine_layer(module: str) -> bool:
    return (
        _under(module, "lucid.bab")
        or _under(module, "lucid.verify")
        or any(_under(module, f"lucid.{name}") for name in ENGINE_REGIONS)
    )


def engine_imports(module: str, imports: set[str]) -> list[str]:
    """The imports of the engine's layer by a module outside it and the command line."""
    if in_engine_layer(module) or _under(module, "lucid.cli"):
        return []
    return sorted(i for i in imports if in_engine_layer(i))


def upward_imports(module: str, imports: set[str]) -> list[str]:
    """The lucid imports of `module` that reach a higher layer than its own."""
    own = layer_of(module)
    return sorted(i for i in imports if _under(i, "lucid") and i.count(".") >= 1 and layer_of(i) > own)


@pytest.mark.parametrize("module, imports", sorted(modules().items()))
def test_every_import_stays_in_its_layer_or_goes_down(module, imports):
    assert not upward_imports(module, imports), f"{module} imports a higher layer: {upward_imports(module, imports)}"


def test_the_layer_rule_sees_an_arrow_back_up():
    assert upward_imports("lucid.bounds.relu_split", {"lucid.analysis.screen", "lucid.analysis.screen.OPTIMISE_STEPS"})
    assert upward_imports("lucid.settings", {"lucid.analysis.encode"})
    assert not upward_imports("lucid.analysis.screen", {"lucid.bounds.symbolic", "lucid.settings"})
    # both are command lines, so the layers allow it: `command_line_imports` is the rule that refuses it
    assert not upward_imports("lucid.baselines.__main__", {"lucid.cli"})
    # the partition sits beside the run directory, the region strategy with the engine
    assert upward_imports("lucid.regions.tree", {"lucid.bab.engine"})
    assert not upward_imports("lucid.verify.regions", {"lucid.bab.engine", "lucid.regions.tree"})
    # the run drives the engine, never the other way (bab/run.py once imported the region strategy)
    assert upward_imports("lucid.bab.engine", {"lucid.verify.regions"})
    assert upward_imports("lucid.regions.one_box", {"lucid.verify.lifecycle"})
    assert engine_imports("lucid.access.classifier", {"lucid.verify.regions", "lucid.bab.engine.Engine"})
    assert not engine_imports("lucid.access.classifier", {"lucid.regions", "lucid.regions.lookup", "lucid.regions.tree"})
    assert not engine_imports("lucid.cli.verify", {"lucid.verify.run"})


def command_line_imports(module: str, imports: set[str]) -> list[str]:
    """The imports of `lucid.cli` by a module that is neither part of it nor `lucid/__main__.py`."""
    if _under(module, "lucid.cli") or module == "lucid.__main__":
        return []
    return sorted(i for i in imports if _under(i, "lucid.cli"))


def test_the_command_line_rule_sees_another_entry_point_import_it():
    assert command_line_imports("lucid.baselines.__main__", {"lucid.cli", "lucid.cli.fail"})
    assert command_line_imports("lucid.training.harness", {"lucid.cli.train"})
    assert not command_line_imports("lucid.__main__", {"lucid.cli", "lucid.cli.main"})
    assert not command_line_imports("lucid.cli.train", {"lucid.cli", "lucid.errors"})


@pytest.mark.parametrize("module, imports", sorted(modules().items()))
def test_import_arrows_run_one_way(module, imports):
    if _under(module, "lucid.milp"):
        upward = [i for i in imports if _under(i, "lucid") and not _under(i, "lucid.milp")
                  and not _under(i, "lucid.errors") and not _under(i, "lucid.atomic")]
        assert not upward, f"{module} (the neutral MILP) imports {sorted(upward)}"
    assert not engine_imports(module, imports), f"{module} imports the engine: {engine_imports(module, imports)}"
    assert not command_line_imports(module, imports), f"{module} imports the command line {command_line_imports(module, imports)}"
    if not _under(module, "lucid.solvers"):
        solver_imports = {i.split(".")[0] for i in imports} & SOLVER_PACKAGES
        assert not solver_imports, f"{module} imports solver packages {sorted(solver_imports)}"


def test_the_checker_sees_lazy_imports(tmp_path):
    """A function-level import counts like a module-level one (the rule would be empty otherwise)."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    import highspy\n    from lucid.bab.engine import Engine\n")
    assert {"highspy", "lucid.bab.engine", "lucid.bab.engine.Engine"} <= imports_of(source)


# No import cycles anywhere in lucid (the memo package had two): a module never imports one
# that imports it back, directly or through others, also where the import is inside a function or
# under `if TYPE_CHECKING:` (a lazy or typing-only import hides a cycle; it does not remove it).
ACYCLIC = ("lucid",)


def import_graph(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """module -> the modules of `trees` its import statements name (anywhere in it). An import names
    the most specific module it can: `from lucid.a import b` names lucid.a.b where that is a module."""
    graph = {}
    for module, tree in trees.items():
        named = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                named.update(_module_of(alias.name, set(trees)) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named.update(_module_of(f"{node.module}.{alias.name}", set(trees)) for alias in node.names)
        graph[module] = {m for m in named if m is not None and m != module}
    return graph


def import_cycles(graph: dict[str, set[str]], within: tuple[str, ...] = ACYCLIC) -> list[list[str]]:
    """The cycles among the modules under `within`: one path a -> ... -> a per module that can reach
    itself (sorted, each cycle named once by its smallest module)."""
    inside = {m: {n for n in out if any(_under(n, p) for p in within)}
              for m, out in graph.items() if any(_under(m, p) for p in within)}
    cycles = {}
    for start in sorted(inside):
        paths, seen = [[start]], {start}
        while paths:
            path = paths.pop(0)
            for nxt in sorted(inside.get(path[-1], ())):
                if nxt == start:
                    cycle = path + [start]
                    key = frozenset(cycle)
                    if key not in cycles and min(cycle) == start:
                        cycles[key] = cycle
                elif nxt not in seen:
                    seen.add(nxt)
                    paths.append(path + [nxt])
    return sorted(cycles.values())


def test_lucid_has_no_import_cycles():
    cycles = import_cycles(import_graph(_parsed()))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_rule_sees_lazy_typing_and_submodule_imports():
    trees = {"lucid.access.a": ast.parse("def f():\n    from lucid.access.b import x\n"),
             "lucid.access.b": ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from lucid.access.pkg import c\n"),
             "lucid.access.pkg": ast.parse("from lucid.access.pkg.c import y\n"),
             "lucid.access.pkg.c": ast.parse("import lucid.access.a\n"),
             "lucid.access.d": ast.parse("from lucid.access import a\n")}
    assert import_cycles(import_graph(trees)) == [
        ["lucid.access.a", "lucid.access.b", "lucid.access.pkg.c", "lucid.access.a"]]
    assert not import_cycles(import_graph({"lucid.access.e": ast.parse("import lucid.access.f\n"),
                                           "lucid.access.f": ast.parse("import json\n")}))


# Imports sit at the top of a module, except the heavy optional packages (and the lucid modules
# that load one at import time), which are imported where they are used so that `lucid serve`,
# `lucid log` or a solver-free path do not pay for them; command-line modules import their
# subcommands lazily by design.
HEAVY_PACKAGES = {"torch", "gurobipy", "highspy", "pyscipopt", "pulp", "distributed", "dask", "matplotlib", "opacus",
                  "sklearn", "scipy", "networkx", "rich", "uvicorn", "fastapi", "starlette", "dp_accounting",
                  "safetensors.torch", "onnx", "onnxruntime", "psycopg", "psycopg_pool"}


def _import_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [node.module]
    return []


def _module_of(name: str, known: set[str]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _parsed() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = str(path.relative_to(ROOT.parent).with_suffix("")).replace("/", ".").removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def heavy(name: str, top_level: dict[str, set[str]], seen: frozenset = frozenset()) -> bool:
    """Whether importing `name` (a package or a lucid module) loads a heavy package."""
    if any(name == p or name.startswith(p + ".") for p in HEAVY_PACKAGES):
        return True
    module = _module_of(name, set(top_level)) if name.startswith("lucid") else None
    if module is None or module in seen:
        return False
    return any(heavy(i, top_level, seen | {module}) for i in top_level[module])


def lazy_imports_that_could_be_at_the_top(trees: dict[str, ast.Module]) -> list[str]:
    top_level = {m: {n for node in tree.body for n in _import_names(node)} for m, tree in trees.items()}
    found = []
    for module, tree in trees.items():
        if _under(module, "lucid.cli") or module.endswith("__main__"):
            continue
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    found += [f"{module}:{node.lineno} {n}" for n in _import_names(node) if not heavy(n, top_level)]
    return sorted(set(found))


def test_imports_are_at_the_top_unless_heavy():
    assert not lazy_imports_that_could_be_at_the_top(_parsed())


def test_the_top_rule_sees_a_light_lazy_import():
    trees = {"lucid.a": ast.parse("import torch\n"), "lucid.b": ast.parse("def f():\n    import json\n"),
             "lucid.c": ast.parse("def f():\n    from lucid.a import x\n    import torch\n    from lucid.b import y\n")}
    assert lazy_imports_that_could_be_at_the_top(trees) == ["lucid.b:2 json", "lucid.c:4 lucid.b"]
