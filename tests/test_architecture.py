"""Facts about the code's shape, checked by parsing the sources with ``ast`` (nothing is imported).

Library code is every module under the packages in ``FLOORS`` (``pipelines/`` included);
``tests/`` and ``benchmarks/`` are never checked as importers (they may import anything).

1. Floors: ``infra < models, curation < training < evaluation < pipelines``. A module may
   import its own package and packages on a lower floor only; ``models`` and ``curation`` share
   a floor and neither imports the other. Library code never imports ``tests`` or
   ``benchmarks`` (they sit above every floor).
2. No import cycles between project modules.
3. The curated-output layout is spelled only in ``curation/output.py`` (see
   ``test_layout_names_are_spelled_only_in_curation_output`` for what counts as spelling it).
4. Functions are short: none over ``MAX_FUNCTION_LINES`` statement lines unless ``LONG_FUNCTIONS`` names
   it with a reason, and the median function is at most ``MAX_MEDIAN_FUNCTION_LINES`` lines.
5. One class per name: no two library classes share a name (``SHARED_CLASS_NAMES`` lists the ones
   another branch is fixing, each with where), and a settings class is a ``*Config``: no library
   class name ends in ``Settings``.

What counts as an import: every ``import`` / ``from ... import`` statement anywhere in a module,
inside functions and ``if`` blocks included (a function-level import still ties the two modules
together; it only moves the failure to run time). An import is attributed to the most specific
project module it names: ``from curation import schema`` -> ``curation.schema``,
``from curation.output import CuratedOutput`` -> ``curation.output``, ``import a.b`` -> ``a.b``.
A ``from`` import is also an edge to the module it reads from (``from curation.audit import
charts`` -> ``curation.audit`` too: the package's ``__init__`` runs first and may import the
importer back). The packages a plain dotted import initialises (``a/__init__.py`` for
``import a.b``) are not counted: that would make every sibling import an edge to the package. Imports
spelled as strings (``importlib.import_module("x")``) are not seen.
"""

from __future__ import annotations

import ast
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Package -> floor. Equal floors are independent: a package imports only lower floors and itself.
FLOORS = {"infra": 0, "models": 1, "curation": 1, "training": 2, "evaluation": 3, "pipelines": 4}
# Project folders that no library module may import (above every floor).
NEVER_IMPORTED = ("tests", "benchmarks")

LAYOUT_MODULE = "curation.output"
# Names that mean a curated-output entry and nothing else in this project: flagged wherever they
# appear in a string literal (whole, or as a path segment: "_dedup/near_index").
LAYOUT_ONLY_NAMES = frozenset({"_SUCCESS", "partitions.jsonl", "_dedup", "_staging", "decisions.parquet", "near_index"})
# Names that are also ordinary words or keys elsewhere (stats["shards"], the "job_digest" field of
# the _SUCCESS marker, MLflow's "stats.json" artifact): flagged only where a path is being built.
LAYOUT_PATH_NAMES = frozenset({"shards", "manifest", "stats.json", "job_digest"})
# "config.yaml" is not checked: every stage writes its resolved config under that name in its own
# folder (training run dirs, probe outputs) and MLflow logs it as an artifact, so the literal alone
# does not say "curated output".
# Calls whose arguments after the first are path segments.
PATH_BUILDERS = frozenset({"join", "joinpath", "Path", "PurePosixPath"})

MAX_FUNCTION_LINES = 45  # statement lines (a wrapped call is one)
MAX_MEDIAN_FUNCTION_LINES = 8
# "module:qualname" -> why it may stay longer than MAX_FUNCTION_LINES. Empty until the lead
# decides on exceptions; an entry that is gone or short again fails the test (no stale excuses).
LONG_FUNCTIONS: dict[str, str] = {}
# class name -> why two library classes may still share it. Only for duplicates another branch
# removes; an entry whose name is no longer shared fails the test (no stale excuses).
SHARED_CLASS_NAMES: dict[str, str] = {}


# ---- reading the sources ----------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    name: str  # dotted: curation.dedup.near; a package's __init__ is the package's name
    path: Path
    rel: str  # path from the repository root, for messages
    tree: ast.Module

    @property
    def package(self) -> str:
        return self.name.split(".")[0]

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load_modules(root: Path, packages=tuple(FLOORS)) -> dict[str, Module]:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            name = module_name(root, path)
            modules[name] = Module(
                name, path, path.relative_to(root).as_posix(), ast.parse(path.read_text(), filename=str(path))
            )
    return modules


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # the most specific project module (or top-level name) the statement names
    line: int


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    """The module a ``from`` import reads from, with relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    base = base if module.is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _most_specific(name: str, known: set[str]) -> str:
    """``name`` or its longest prefix that is a project module; the top-level name otherwise."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return parts[0]


def imports_of(module: Module, known: set[str]) -> Iterator[Import]:
    """Every import statement of ``module`` (function-level ones included), one per name."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module.name, _most_specific(alias.name, known), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            if source in known and source != module.name:
                # ``from pkg import sub`` reads from ``pkg``: its __init__ runs and may import back
                yield Import(module.name, source, node.lineno)
            for alias in node.names:
                yield Import(module.name, _most_specific(f"{source}.{alias.name}", known), node.lineno)


def project_imports(modules: dict[str, Module]) -> list[Import]:
    known = set(modules)
    return [
        imp
        for m in modules.values()
        for imp in imports_of(m, known)
        if imp.target.split(".")[0] in FLOORS or imp.target.split(".")[0] in NEVER_IMPORTED
    ]


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    found = load_modules(REPO)
    assert {m.package for m in found.values()} == set(FLOORS), "a package of FLOORS has no Python module"
    return found


# ---- 1. floors --------------------------------------------------------------------------------


def floor_violations(modules: dict[str, Module]) -> list[str]:
    problems = set()  # one line per (module, line, target): `from a import b, c` names a once
    for imp in project_imports(modules):
        mine, theirs = imp.importer.split(".")[0], imp.target.split(".")[0]
        if theirs == mine:
            continue
        if theirs in NEVER_IMPORTED:
            why = f"{theirs}/ is not library code"
        elif FLOORS[theirs] > FLOORS[mine]:
            why = f"{theirs} (floor {FLOORS[theirs]}) is above {mine} (floor {FLOORS[mine]})"
        elif FLOORS[theirs] == FLOORS[mine]:
            why = f"{theirs} and {mine} share floor {FLOORS[mine]} and must not import each other"
        else:
            continue
        problems.add(
            (
                modules[imp.importer].rel,
                imp.line,
                f"{modules[imp.importer].rel}:{imp.line}: {imp.importer} imports {imp.target}: {why}",
            )
        )
    return [text for _, _, text in sorted(problems)]


def test_no_module_imports_a_package_above_its_floor(modules):
    problems = floor_violations(modules)
    assert not problems, (
        f"{len(problems)} imports break the floors infra < models, curation < training "
        "< evaluation < pipelines (move the code down, or pass the value in):\n  " + "\n  ".join(problems)
    )


# ---- 2. cycles --------------------------------------------------------------------------------


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """importer -> {imported project module: line of its first import}."""
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for imp in project_imports(modules):
        if imp.target in modules and imp.target != imp.importer:
            graph[imp.importer].setdefault(imp.target, imp.line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, staying inside the component."""
    start, inside = component[0], set(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child in inside and child not in parent:
                    parent[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{component} is not a cycle")


def describe_cycle(modules: dict[str, Module], graph: dict[str, dict[str, int]], component: list[str]) -> str:
    cycle = shortest_cycle(graph, component)
    steps = [f"{modules[a].rel}:{graph[a][b]} imports {b}" for a, b in zip(cycle, cycle[1:])]
    return f"{len(component)} modules ({', '.join(component)}); one cycle: " + " -> ".join(steps)


def test_no_import_cycles(modules):
    graph = import_graph(modules)
    cycles = [describe_cycle(modules, graph, c) for c in strongly_connected(graph)]
    assert not cycles, (
        "modules that import each other, directly or through others (break each cycle by "
        "moving the shared code down or passing it in):\n  " + "\n  ".join(cycles)
    )


# ---- 3. layout literals -----------------------------------------------------------------------


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.add(id(first.value))
    return found


def _call_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _path_contexts(tree: ast.Module) -> dict[int, str]:
    """ids of the string constants used as path segments -> how: ``join(root, "x")`` (any
    argument after the first), ``Path("x")``, ``root / "x"``, or the value of a module-level
    UPPER_CASE constant (a second definition of a layout name)."""
    found: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) in PATH_BUILDERS:
            args = node.args if _call_name(node) in ("Path", "PurePosixPath") else node.args[1:]
            for arg in args:
                found[id(arg)] = f"argument of {_call_name(node)}()"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found[id(node.right)] = "operand of /"
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, (ast.Name, ast.Tuple)) for t in node.targets):
            names = [
                n.id
                for t in node.targets
                for n in ([t] if isinstance(t, ast.Name) else t.elts)
                if isinstance(n, ast.Name)
            ]
            if names and all(n.isupper() for n in names):
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                for value in values:
                    found[id(value)] = f"value of the constant {', '.join(names)}"
    return found


def layout_literals(module: Module) -> list[str]:
    docstrings, contexts = _docstrings(module.tree), _path_contexts(module.tree)
    problems = []
    for node in sorted(ast.walk(module.tree), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
            continue
        segments = set(node.value.split("/"))
        unambiguous = segments & LAYOUT_ONLY_NAMES
        in_path = segments & LAYOUT_PATH_NAMES if ("/" in node.value or id(node) in contexts) else set()
        for name in sorted(unambiguous | in_path):
            how = contexts.get(id(node), "a path string" if "/" in node.value else "a layout-only name")
            problems.append(f"{module.rel}:{node.lineno}: {node.value!r} spells the layout name {name!r} ({how})")
    return problems


def test_layout_names_are_spelled_only_in_curation_output(modules):
    """The curated-output layout (folder and file names) is written down once, in ``curation/output.py``.

    Flagged outside it, in library code, except docstrings:
    - any string literal containing one of ``LAYOUT_ONLY_NAMES`` as a whole or as a ``/``-separated
      segment (these names mean nothing else here);
    - ``LAYOUT_PATH_NAMES`` (``shards``, ``manifest``, ``stats.json``, ``job_digest``) only as a path
      segment: an argument after the first of a ``join``/``joinpath`` call, an argument of
      ``Path(...)``, the right operand of ``/``, a segment of a string containing ``/``, or the
      value of a module-level UPPER_CASE constant (a second definition of the name). Elsewhere they
      are keys or words: ``stats["shards"]``, the ``job_digest`` field of the ``_SUCCESS`` marker,
      MLflow's ``stats.json`` artifact.
    ``config.yaml`` is not checked: it is also every stage's own config file and MLflow's artifact.
    """
    problems = [p for name, m in sorted(modules.items()) if name != LAYOUT_MODULE for p in layout_literals(m)]
    assert not problems, (
        f"{len(problems)} spellings of the curated-output layout outside curation/output.py "
        "(use its constants, path functions or CuratedOutput instead):\n  " + "\n  ".join(problems)
    )


# ---- 4. function length -----------------------------------------------------------------------


def function_lengths(modules: dict[str, Module]) -> dict[str, tuple[int, str]]:
    """ "module:qualname" -> (statement lines, "path:line"): the lines on which one of its
    statements starts, its ``def`` included, so a call the formatter wraps over several lines
    counts once. Nested functions count on their own and inside their enclosing function."""
    lengths = {}

    def statement_lines(func: ast.AST) -> int:
        return len({n.lineno for n in ast.walk(func) if isinstance(n, ast.stmt)})

    def visit(node: ast.AST, prefix: str, module: Module) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                lengths[f"{module.name}:{name}"] = (statement_lines(child), f"{module.rel}:{child.lineno}")
                visit(child, f"{name}.", module)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", module)
            else:
                visit(child, prefix, module)

    for module in modules.values():
        visit(module.tree, "", module)
    return lengths


def test_functions_are_short(modules):
    lengths = function_lengths(modules)
    ranked = sorted(lengths.items(), key=lambda kv: -kv[1][0])
    median = statistics.median(n for n, _ in lengths.values())
    print(f"\n{len(lengths)} functions in library code, median {median} lines; the longest:")
    for name, (n, where) in ranked[:25]:
        print(f"  {n:4d}  {name}  ({where})")
    too_long = [
        f"{where}: {name} has {n} lines"
        for name, (n, where) in ranked
        if n > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS
    ]
    stale = [
        f"{name}: {'no such function' if name not in lengths else f'{lengths[name][0]} lines'}"
        for name in LONG_FUNCTIONS
        if name not in lengths or lengths[name][0] <= MAX_FUNCTION_LINES
    ]
    assert not too_long, (
        f"{len(too_long)} functions over {MAX_FUNCTION_LINES} lines (split them along their "
        "steps, or add them to LONG_FUNCTIONS with the reason):\n  " + "\n  ".join(too_long)
    )
    assert not stale, "LONG_FUNCTIONS names functions that are gone or short now:\n  " + "\n  ".join(stale)
    assert median <= MAX_MEDIAN_FUNCTION_LINES, (
        f"the median function has {median} lines (at most {MAX_MEDIAN_FUNCTION_LINES})"
    )


# ---- 5. one class per name --------------------------------------------------------------------


def class_definitions(modules: dict[str, Module]) -> dict[str, list[str]]:
    """class name -> every "path:line" defining a class of that name (nested classes included)."""
    found: dict[str, list[str]] = {}
    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(f"{module.rel}:{node.lineno}")
    return {name: sorted(places) for name, places in found.items()}


def shared_class_names(modules: dict[str, Module]) -> dict[str, list[str]]:
    return {name: places for name, places in class_definitions(modules).items() if len(places) > 1}


def test_no_two_library_classes_share_a_name(modules):
    shared = shared_class_names(modules)
    problems = [
        f"{name}: {', '.join(places)}" for name, places in sorted(shared.items()) if name not in SHARED_CLASS_NAMES
    ]
    stale = [name for name in SHARED_CLASS_NAMES if name not in shared]
    assert not problems, (
        f"{len(problems)} class names defined more than once in library code (keep one where they are "
        "the same concept; name each for what it is where they differ):\n  " + "\n  ".join(problems)
    )
    assert not stale, "SHARED_CLASS_NAMES names classes that are unique now: " + ", ".join(stale)


def test_settings_classes_are_named_config(modules):
    named_settings = [
        f"{name}: {', '.join(places)}"
        for name, places in sorted(class_definitions(modules).items())
        if name.endswith("Settings")
    ]
    assert not named_settings, "settings classes are named *Config (one suffix for one concept):\n  " + "\n  ".join(
        named_settings
    )


# ---- the checks themselves, on a made-up project -----------------------------------------------


def _write(root: Path, files: dict[str, str]) -> dict[str, Module]:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return load_modules(root, packages=sorted({rel.split("/")[0] for rel in files}))


def test_checks_see_function_level_relative_and_from_imports(tmp_path):
    found = _write(
        tmp_path,
        {
            "infra/__init__.py": "",
            "infra/a.py": "def f():\n    from curation import b\n",
            "curation/__init__.py": "",
            "curation/b.py": "from . import c\n",
            "curation/c.py": "import curation.b\nfrom models.m import thing\n",
            "models/m.py": "thing = 1\n",
        },
    )
    assert floor_violations(found) == [
        "curation/c.py:2: curation.c imports models.m: models and curation share floor 1 and must not import "
        "each other",
        "infra/a.py:2: infra.a imports curation.b: curation (floor 1) is above infra (floor 0)",
        "infra/a.py:2: infra.a imports curation: curation (floor 1) is above infra (floor 0)",
    ]
    graph = import_graph(found)
    assert strongly_connected(graph) == [["curation.b", "curation.c"]]
    assert describe_cycle(found, graph, ["curation.b", "curation.c"]) == (
        "2 modules (curation.b, curation.c); one cycle: curation/b.py:1 imports curation.c -> "
        "curation/c.py:1 imports curation.b"
    )


def test_a_from_import_through_a_package_whose_init_imports_back_is_a_cycle(tmp_path):
    found = _write(
        tmp_path,
        {
            "evaluation/__init__.py": "from evaluation.run import go\n",
            "evaluation/run.py": "from evaluation.tasks import t\ndef go(): pass\n",
            "evaluation/tasks.py": "from evaluation import viz\nt = 1\n",
            "evaluation/viz.py": "",
        },
    )
    assert strongly_connected(import_graph(found)) == [["evaluation", "evaluation.run", "evaluation.tasks"]]
    fixed = _write(
        tmp_path / "fixed",
        {
            "evaluation/__init__.py": "from evaluation.run import go\n",
            "evaluation/run.py": "from evaluation.tasks import t\ndef go(): pass\n",
            "evaluation/tasks.py": "import evaluation.viz as viz\nt = 1\n",
            "evaluation/viz.py": "",
        },
    )
    assert strongly_connected(import_graph(fixed)) == []


def test_layout_check_tells_paths_from_keys(tmp_path):
    found = _write(
        tmp_path,
        {
            "curation/x.py": (
                '"""Writes shards/ and _SUCCESS (a docstring: not flagged)."""\n'
                'SHARDS = "shards"\n'
                "def f(stats, root, join):\n"
                '    n = stats["shards"] + stats["job_digest"]\n'
                '    return join(root, "manifest"), root / "stats.json", f"{root}/_dedup/x", "near_index"\n'
            )
        },
    )
    assert layout_literals(found["curation.x"]) == [
        "curation/x.py:2: 'shards' spells the layout name 'shards' (value of the constant SHARDS)",
        "curation/x.py:5: 'manifest' spells the layout name 'manifest' (argument of join())",
        "curation/x.py:5: 'stats.json' spells the layout name 'stats.json' (operand of /)",
        "curation/x.py:5: '/_dedup/x' spells the layout name '_dedup' (a path string)",
        "curation/x.py:5: 'near_index' spells the layout name 'near_index' (a layout-only name)",
    ]


def test_function_lengths_count_methods_and_nested_functions(tmp_path):
    found = _write(
        tmp_path,
        {"training/y.py": "class A:\n    def m(self):\n        def inner():\n            pass\n        return inner\n"},
    )
    assert function_lengths(found) == {
        "training.y:A.m": (4, "training/y.py:2"),
        "training.y:A.m.inner": (2, "training/y.py:3"),
    }


def test_function_lengths_do_not_count_a_wrapped_call_twice(tmp_path):
    found = _write(tmp_path, {"training/z.py": "def f(a):\n    return g(\n        a,\n        a,\n    )\n"})
    assert function_lengths(found) == {"training.z:f": (2, "training/z.py:1")}


def test_shared_class_names_are_found_across_packages_and_nesting(tmp_path):
    found = _write(
        tmp_path,
        {
            "models/a.py": "class Head:\n    pass\nclass Only:\n    class Inner:\n        pass\n",
            "evaluation/b.py": "def f():\n    class Head:\n        pass\nclass Inner:\n    pass\n",
        },
    )
    assert shared_class_names(found) == {
        "Head": ["evaluation/b.py:2", "models/a.py:1"],
        "Inner": ["evaluation/b.py:4", "models/a.py:4"],
    }
