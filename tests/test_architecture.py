"""The import graph of evolve/ (function-level imports included): no circle, no upward arrow.

A circle means two modules cannot be understood (or moved) apart; it usually marks a helper filed in
the wrong module. The storage layer (``store/``) and the work sources (``work/``) are below the
agent runners, the cycle and the commands, so they must not import them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import evolve

ROOT = Path(evolve.__file__).parent
LOWER = ("evolve.work", "evolve.store")
UPPER = ("evolve.agent", "evolve.cycle", "evolve.commands")

# The layers of docs/DESIGN.md §13, bottom first: a module may import its own layer or any below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("evolve", "evolve.paths", "evolve.timeutil", "evolve.errors", "evolve.exitcodes", "evolve.results",
              "evolve.redact", "evolve.crashpoint", "evolve.jsonsafe", "evolve.log", "evolve.config",
              "evolve.cronexpr", "evolve.sdnotify", "evolve.config_template", "evolve.deploy_templates",
              "evolve.childenv", "evolve.tty", "evolve.sandbox", "evolve.trusted")),
    ("store", ("evolve.store",)),
    ("process", ("evolve.procgroup", "evolve.git", "evolve.configtrust")),
    ("work", ("evolve.work",)),
    ("agent", ("evolve.agent",)),
    ("harness", ("evolve.harness",)),
    ("cycle", ("evolve.cycle",)),
    ("read side", ("evolve.status", "evolve.metrics", "evolve.report", "evolve.notify", "evolve.doctor",
                   "evolve.deploy", "evolve.init", "evolve.demo")),
    ("scheduler", ("evolve.scheduler",)),
    ("commands", ("evolve.commands",)),
    ("cli", ("evolve.cli", "evolve.__main__")),
)


def layer_of(name: str) -> int | None:
    """The layer index of a module: its longest matching prefix (``evolve`` itself matches only exactly)."""
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or (p != "evolve" and name.startswith(p + "."))) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return best[0] if best else None


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("evolve", *path.relative_to(ROOT).with_suffix("").parts))
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The evolve modules ``name`` imports anywhere in its body (``from pkg import mod`` counts as mod)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in mods:
                    out.add(target)
                elif base in mods:
                    out.add(base)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in mods)
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_graph_is_read() -> None:
    graph = _graph()
    assert "evolve.work.item" in graph["evolve.work.harvested"]  # sanity: the parser sees real edges
    assert "evolve.procgroup" in graph["evolve.work.beads"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_work_and_store_import_nothing_above_them() -> None:
    upward = sorted(
        f"{name} -> {dep}"
        for name, deps in _graph().items()
        if _under(name, LOWER)
        for dep in deps
        if _under(dep, UPPER)
    )
    assert upward == []


def test_every_module_has_a_layer() -> None:
    assert sorted(name for name in _graph() if layer_of(name) is None) == []


def test_imports_point_down_the_layers() -> None:
    upward = sorted(
        f"{name} ({LAYERS[layer_of(name)][0]}) -> {dep} ({LAYERS[layer_of(dep)][0]})"  # type: ignore[index]
        for name, deps in _graph().items()
        for dep in deps
        if (layer_of(dep) or 0) > (layer_of(name) or 0)
    )
    assert upward == []


def test_the_layer_check_sees_an_upward_arrow() -> None:
    assert layer_of("evolve.store.ledger") == 1 and layer_of("evolve.cycle.fire") == 6 and layer_of("evolve") == 0
    assert (layer_of("evolve.cycle.fire") or 0) > (layer_of("evolve.work.item") or 0)
