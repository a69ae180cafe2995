"""The package's layers hold (docs/architecture.md, "Layers"): the import graph of ``hf_condinit/`` and the example
scripts at the repository root has no circle, the library never imports ``hf_condinit/scripts/`` (only the scripts
layer and its front, ``scripts_common``, do), the root scripts reach the scripts layer through that front alone, and
no module imports another's private name. Read from the source (``ast``), every import counted, function-local
ones included."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRONT = "hf_condinit.scripts_common"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """``{dotted module name: file}`` for every module of ``hf_condinit/`` and every ``*.py`` at the root."""
    files = {}
    for path in sorted((root / "hf_condinit").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted(root.glob("*.py")):
        files[path.stem] = path
    return files


def _imports(name: str, path: Path):
    """``(imported module or package, imported name or None, node)`` for each import statement of a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                yield base, alias.name, node


def _known(dotted: str, files) -> str | None:
    """The longest prefix of ``dotted`` that is one of ``files``' modules, or None (a third-party module)."""
    while dotted and dotted not in files:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``{module: the package's modules it imports}``; ``from package import name`` counts as an arrow to the
    submodule ``package.name`` when there is one, else to the package."""
    files = module_files(root)
    graph = {}
    for name, path in files.items():
        targets = set()
        for base, imported, _ in _imports(name, path):
            target = f"{base}.{imported}" if imported and f"{base}.{imported}" in files else _known(base, files)
            if target and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> str:
    """``"scripts"`` (the root scripts), ``"scripts layer"`` (``hf_condinit/scripts/`` and its front) or
    ``"library"``."""
    if not module.startswith("hf_condinit"):
        return "scripts"
    if module == FRONT or module == "hf_condinit.scripts" or module.startswith("hf_condinit.scripts."):
        return "scripts layer"
    return "library"


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """The arrows that climb a layer (library < scripts layer < root scripts), and a root script's arrow into
    ``hf_condinit/scripts/`` that does not go through the front."""
    order = {"library": 0, "scripts layer": 1, "scripts": 2}
    bad = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            if order[layer(target)] > order[layer(source)]:
                bad.append(f"{source} -> {target}")
            elif layer(source) == "scripts" and layer(target) == "scripts layer" and target != FRONT:
                bad.append(f"{source} -> {target} (not through {FRONT})")
    return bad


def private_imports(root: Path = ROOT) -> list[str]:
    """``from module import _name`` and ``module._name`` where ``module`` is another module of the package."""
    files = module_files(root)
    found = []
    for name, path in files.items():
        modules = set()  # local names bound to one of the package's modules
        for base, imported, node in _imports(name, path):
            where = f"{path.relative_to(root)}:{node.lineno}"
            if _known(base, files) is None:
                continue
            if imported is None:
                modules.add(base.split(".")[0])
                continue
            if f"{base}.{imported}" in files:
                modules.add(imported)
            elif imported.startswith("_") and not imported.startswith("__"):
                found.append(f"{where}: from {base} import {imported}")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_graph_reads_the_package():
    graph = import_graph()
    assert "hf_condinit.scripts.lifecycle" in graph and "run_clm" in graph
    assert {"hf_condinit.api", "hf_condinit.parallel"} <= graph["hf_condinit.hooks"]
    assert FRONT in graph["run_clm"]
    assert "hf_condinit.attention.catalog" in graph["hf_condinit.config"]  # a function-local import counts


def test_no_circle():
    assert circles(import_graph()) == []


def test_no_arrow_climbs_a_layer():
    assert arrows_up(import_graph()) == []


def test_no_private_name_crosses_modules():
    assert private_imports() == []


def test_the_checks_catch_what_they_look_for():
    graph = {"hf_condinit.a": {"hf_condinit.b"}, "hf_condinit.b": {"hf_condinit.a"}, "hf_condinit.c": set(),
             "hf_condinit.scripts.x": {"hf_condinit.c"}, "hf_condinit.d": {"hf_condinit.scripts.x"},
             "run_x": {"hf_condinit.scripts.x", FRONT}, FRONT: set()}
    assert circles(graph) == [["hf_condinit.a", "hf_condinit.b"]]
    assert arrows_up(graph) == ["hf_condinit.d -> hf_condinit.scripts.x",
                                f"run_x -> hf_condinit.scripts.x (not through {FRONT})"]
