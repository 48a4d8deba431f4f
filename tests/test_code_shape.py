"""The gate of issue 26 ("one house, rooms by stage"): what a newcomer meets stays small.

Over connectors/, sinks/ and pipelines/: no function above radon complexity 15 (boolean
operators counted, unlike ruff's C901), no function over 60 lines without a reason written
below, no class over 520 lines, no package directory of sinks/ or pipelines/ with more than
15 modules, no family of sibling modules named by a prefix (`lake_a`, `lake_b`, `lake_c`:
a folder says the stage), and no import cycle outside the simulator. Each check is a
function over a source tree, proven on a synthetic offender by the tests at the end.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from radon.visitors import ComplexityVisitor

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("connectors", "sinks", "pipelines")
# Package directories whose size is measured: the stages' rooms (connectors/ is one room).
ROOMS = ("sinks", "pipelines")
# Imports among the simulator's own modules are its business: it plays the node, not a stage.
CYCLES_IGNORED = ("connectors.simulator",)

MAX_COMPLEXITY = 15
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 520
MAX_MODULES = 15
MIN_FAMILY = 3

# Functions allowed past MAX_FUNCTION_LINES, each with the reason it reads better whole.
LONG_FUNCTIONS: dict[str, str] = {}

# Known offenders being removed on a branch, each with who removes it; an entry that no
# longer offends fails the gate too, so the list only shrinks. Empty since issue 26.
PENDING: dict[str, str] = {}


@dataclass(frozen=True)
class Module:
    """A source file as the checks see it: its dotted name and its syntax tree."""

    name: str
    path: Path
    tree: ast.Module

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Module]:
    """Every .py file under the packages, by dotted name (a package by its own name)."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found.append(Module(name, path, ast.parse(path.read_text(encoding="utf-8"))))
    return found


def _definitions(
    node: ast.AST, prefix: str
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]]:
    """(qualified name, node) of every function and class, nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}.{child.name}"
            yield name, child
            yield from _definitions(child, name)
        else:
            yield from _definitions(child, prefix)


def _lines(node: ast.AST) -> int:
    """Lines from `def`/`class` to the last line of the body (decorators not counted)."""
    return (node.end_lineno or node.lineno) - node.lineno + 1


def complexity(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """radon's cyclomatic complexity of one function (nested functions count apart)."""
    visitor = ComplexityVisitor.from_ast(ast.Module(body=[node], type_ignores=[]))
    return int(visitor.functions[0].complexity)


def complex_functions(found: list[Module]) -> dict[str, str]:
    scores = {
        name: complexity(node)
        for module in found
        for name, node in _definitions(module.tree, module.name)
        if not isinstance(node, ast.ClassDef)
    }
    return {
        name: f"complexity {score} > {MAX_COMPLEXITY}"
        for name, score in scores.items()
        if score > MAX_COMPLEXITY
    }


def long_functions(found: list[Module], allowed: Mapping[str, str]) -> dict[str, str]:
    return {
        name: f"{_lines(node)} lines > {MAX_FUNCTION_LINES}"
        for module in found
        for name, node in _definitions(module.tree, module.name)
        if not isinstance(node, ast.ClassDef)
        and _lines(node) > MAX_FUNCTION_LINES
        and name not in allowed
    }


def long_classes(found: list[Module]) -> dict[str, str]:
    return {
        name: f"{_lines(node)} lines > {MAX_CLASS_LINES}"
        for module in found
        for name, node in _definitions(module.tree, module.name)
        if isinstance(node, ast.ClassDef) and _lines(node) > MAX_CLASS_LINES
    }


def crowded_packages(root: Path, rooms: tuple[str, ...] = ROOMS) -> dict[str, str]:
    """Package directories holding more than MAX_MODULES modules (a package's __init__.py
    is not one: it holds nothing a reader opens it for)."""
    crowded = {}
    for room in rooms:
        for init in sorted((root / room).rglob("__init__.py")):
            count = sum(1 for path in init.parent.glob("*.py") if path.name != "__init__.py")
            if count > MAX_MODULES:
                name = ".".join(init.parent.relative_to(root).parts)
                crowded[name] = f"{count} modules > {MAX_MODULES}"
    return crowded


def families(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Sibling modules (or subpackages) that share a name prefix before `_`: three or more
    are a stage that wants a folder of its own."""
    found = {}
    for package in packages:
        for init in sorted((root / package).rglob("__init__.py")):
            folder = init.parent
            names = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
            names += [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()]
            by_prefix: dict[str, list[str]] = defaultdict(list)
            for name in names:
                by_prefix[name.split("_", 1)[0]].append(name)
            for prefix, members in sorted(by_prefix.items()):
                if len(members) >= MIN_FAMILY and any("_" in m for m in members):
                    where = ".".join(folder.relative_to(root).parts)
                    found[f"{where}.{prefix}_*"] = ", ".join(sorted(members))
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (in functions too), except those under
    `if TYPE_CHECKING:`, which never run."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _type_checking(child.test):
            yield from _imports(ast.Module(body=child.orelse, type_ignores=[]))
        else:
            yield from _imports(child)


def _targets(module: Module, statement: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The known modules an import statement loads by name."""
    if isinstance(statement, ast.Import):
        wanted = [alias.name for alias in statement.names]
    else:
        base = statement.module or ""
        if statement.level:
            package = module.name if module.is_package else module.name.rpartition(".")[0]
            parts = package.split(".")
            anchor = ".".join(parts[: len(parts) - statement.level + 1])
            base = f"{anchor}.{base}" if base else anchor
        # `from pkg import name`: the submodule `pkg.name` if there is one, else pkg itself.
        submodules = [f"{base}.{alias.name}" for alias in statement.names]
        wanted = [name for name in submodules if name in known] or [base]
    targets = set()
    for name in wanted:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module.name:
            targets.add(name)
    return targets


def import_graph(found: list[Module], ignored: tuple[str, ...] = ()) -> dict[str, set[str]]:
    def counted(name: str) -> bool:
        return not any(name == i or name.startswith(f"{i}.") for i in ignored)

    known = {module.name for module in found}
    return {
        module.name: {
            target
            for statement in _imports(module.tree)
            for target in _targets(module, statement, known)
            if counted(target)
        }
        for module in found
        if counted(module.name)
    }


def _components(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan), each sorted; only those of 2+ modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _chain(graph: Mapping[str, set[str]], members: list[str]) -> list[str]:
    """One cycle through the component's first module, as its chain of imports."""
    inside = set(members)
    start = members[0]
    paths = [[start]]
    seen = {start}
    while paths:  # breadth first: the shortest way back to the start
        path = paths.pop(0)
        for target in sorted(graph[path[-1]] & inside):
            if target == start:
                return [*path, start]
            if target not in seen:
                seen.add(target)
                paths.append([*path, target])
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def import_cycles(graph: Mapping[str, set[str]]) -> dict[str, str]:
    """A cycle per group of modules that import each other, keyed by the group."""
    return {
        f"cycle: {', '.join(members)}": " -> ".join(_chain(graph, members))
        for members in _components(graph)
    }


def _report(offenders: Mapping[str, str], what: str) -> str:
    lines = [f"{name}: {why}" for name, why in sorted(offenders.items())]
    return f"{len(offenders)} {what}:\n  " + "\n  ".join(lines)


def _new(offenders: Mapping[str, str]) -> dict[str, str]:
    return {name: why for name, why in offenders.items() if name not in PENDING}


# -- the gate over this repository ---------------------------------------------------------


@pytest.fixture(scope="module")
def tree() -> list[Module]:
    return modules(ROOT)


def current_offenders(tree: list[Module]) -> dict[str, str]:
    return {
        **complex_functions(tree),
        **long_functions(tree, LONG_FUNCTIONS),
        **long_classes(tree),
        **crowded_packages(ROOT),
        **families(ROOT),
        **import_cycles(import_graph(tree, CYCLES_IGNORED)),
    }


def test_no_function_is_too_complex(tree: list[Module]) -> None:
    offenders = _new(complex_functions(tree))
    assert not offenders, _report(offenders, "functions above radon complexity 15")


def test_no_function_is_too_long_without_a_reason(tree: list[Module]) -> None:
    offenders = _new(long_functions(tree, LONG_FUNCTIONS))
    assert not offenders, _report(offenders, "functions over 60 lines (or give a reason)")


def test_no_class_is_too_long(tree: list[Module]) -> None:
    offenders = _new(long_classes(tree))
    assert not offenders, _report(offenders, "classes over 520 lines")


def test_no_package_holds_too_many_modules() -> None:
    offenders = _new(crowded_packages(ROOT))
    assert not offenders, _report(offenders, "package directories over 15 modules")


def test_no_family_of_modules_shares_a_prefix() -> None:
    offenders = _new(families(ROOT))
    assert not offenders, _report(offenders, "families of prefixed modules (make a folder)")


def test_no_import_cycle_outside_the_simulator(tree: list[Module]) -> None:
    offenders = _new(import_cycles(import_graph(tree, CYCLES_IGNORED)))
    assert not offenders, _report(offenders, "import cycles")


def test_exceptions_name_only_current_offenders(tree: list[Module]) -> None:
    """PENDING holds offenders still to fix outside the cli, LONG_FUNCTIONS functions still
    long: an entry that no longer offends is deleted, so it cannot hide a new one later."""
    current = current_offenders(tree)
    stale = {name: owner for name, owner in PENDING.items() if name not in current}
    assert not stale, _report(stale, "PENDING entries no longer offend: delete them")
    cli = [name for name in PENDING if name.removeprefix("cycle: ").startswith("pipelines.cli")]
    assert not cli, f"pipelines/cli/ is gated already, not pending: {cli}"
    lengths = {
        name: _lines(node)
        for module in tree
        for name, node in _definitions(module.tree, module.name)
        if name in LONG_FUNCTIONS
    }
    short = [n for n in LONG_FUNCTIONS if lengths.get(n, 0) <= MAX_FUNCTION_LINES]
    assert not short, f"LONG_FUNCTIONS entries that are gone or short now: {short}"


# -- each check, proven on a synthetic offender ---------------------------------------------


def write(root: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def one_module(tmp_path: Path, source: str) -> list[Module]:
    write(tmp_path, {"pkg/__init__.py": "", "pkg/mod.py": source})
    return modules(tmp_path, ("pkg",))


def branches(count: int) -> str:
    """A function of radon complexity 1 + count, every decision a boolean operator."""
    return "def f(a, b):\n    return a" + " and b" * count + "\n"


def test_complexity_counts_boolean_operators(tmp_path: Path) -> None:
    assert complex_functions(one_module(tmp_path, branches(MAX_COMPLEXITY - 1))) == {}
    found = complex_functions(one_module(tmp_path, branches(MAX_COMPLEXITY)))
    assert found == {"pkg.mod.f": "complexity 16 > 15"}


def test_complexity_names_a_method_of_a_nested_class(tmp_path: Path) -> None:
    source = "def outer():\n    class Inner:\n        " + branches(20).replace(
        "\n    ", "\n" + " " * 12
    )
    found = complex_functions(one_module(tmp_path, source))
    assert list(found) == ["pkg.mod.outer.Inner.f"]


def body(lines: int) -> str:
    """A function `f` of exactly `lines` lines."""
    return "def f():\n" + "    x = 1\n" * (lines - 2) + "    return x\n"


def test_a_function_over_60_lines_offends_unless_given_a_reason(tmp_path: Path) -> None:
    assert long_functions(one_module(tmp_path, body(MAX_FUNCTION_LINES)), {}) == {}
    found = long_functions(one_module(tmp_path, body(MAX_FUNCTION_LINES + 1)), {})
    assert found == {"pkg.mod.f": "61 lines > 60"}
    tree = one_module(tmp_path, body(MAX_FUNCTION_LINES + 1))
    assert long_functions(tree, {"pkg.mod.f": "a table, read top to bottom"}) == {}


def test_a_class_over_520_lines_offends(tmp_path: Path) -> None:
    fits = "class C:\n" + "    x = 1\n" * (MAX_CLASS_LINES - 1)
    assert long_classes(one_module(tmp_path, fits)) == {}
    found = long_classes(one_module(tmp_path, fits + "    y = 2\n"))
    assert found == {"pkg.mod.C": "521 lines > 520"}


def test_a_package_over_15_modules_offends(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": "", "pkg/room/__init__.py": ""}
    files.update({f"pkg/room/m{i}.py": "" for i in range(MAX_MODULES)})
    assert crowded_packages(write(tmp_path, files), ("pkg",)) == {}
    write(tmp_path, {"pkg/room/one_more.py": ""})
    assert crowded_packages(tmp_path, ("pkg",)) == {"pkg.room": "16 modules > 15"}


def test_three_modules_sharing_a_prefix_are_a_family(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": "", "pkg/lake_a.py": "", "pkg/lake_b.py": "", "pkg/lakes.py": ""}
    assert families(write(tmp_path, files), ("pkg",)) == {}
    write(tmp_path, {"pkg/lake_c/__init__.py": ""})
    assert families(tmp_path, ("pkg",)) == {"pkg.lake_*": "lake_a, lake_b, lake_c"}


def test_an_import_cycle_is_named_by_its_chain(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "def later():\n    from .c import x\n",  # function level, relative
            "pkg/c.py": "import pkg.a\nx = 1\n",
            "pkg/d.py": "from pkg.a import name\n",
        },
    )
    graph = import_graph(modules(tmp_path, ("pkg",)))
    assert import_cycles(graph) == {
        "cycle: pkg.a, pkg.b, pkg.c": "pkg.a -> pkg.b -> pkg.c -> pkg.a"
    }


def test_imports_for_type_checking_only_make_no_cycle(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import B\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.a import A\nelse:\n    B = 1\n",
        },
    )
    assert import_cycles(import_graph(modules(tmp_path, ("pkg",)))) == {}


def test_an_ignored_package_makes_no_cycle(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sim/__init__.py": "",
            "pkg/sim/a.py": "from pkg.sim import b\n",
            "pkg/sim/b.py": "from pkg.sim import a\n",
        },
    )
    graph = import_graph(modules(tmp_path, ("pkg",)), ignored=("pkg.sim",))
    assert import_cycles(graph) == {}
    assert list(import_cycles(import_graph(modules(tmp_path, ("pkg",))))) == [
        "cycle: pkg.sim.a, pkg.sim.b"
    ]


def test_pending_offenders_are_skipped_and_new_ones_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(PENDING, "pkg.mod.old", "issue 26: pkg")
    assert _new({"pkg.mod.old": "x", "pkg.mod.new": "y"}) == {"pkg.mod.new": "y"}
