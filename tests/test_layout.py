"""The package's layout holds: imports point one way along the flow (no cycle, lazy imports
included; no import from a folder to one later in the data flow), and no module grows past what one
reader holds."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "sbs_widget"
MAX_LINES = 450
MAX_FUNCTION_LINES = 80

# The data flow, first to last: a module may import its own layer and the layers before it, never a
# later one (lazy and typing-only imports included). "base": the top-level modules (errors, records,
# dtypes, strings, safe_files, safe_text, shared_rules...) and the samples; "top": cli, testing.py,
# __main__.py and the package root, which may import anything. Folders of one layer (blame, deployed,
# dumps) may import each other as long as no cycle runs between them.
FLOW = (
    ("base", "samples"),
    ("load",),
    ("align",),
    ("engine",),
    ("blame", "deployed", "dumps"),
    ("steps", "twomodels"),
    ("graphs",),
    ("views",),
    ("gate",),
    ("top",),
)
RANK = {folder: rank for rank, layer in enumerate(FLOW) for folder in layer}
# the samples build their models with the loaders (export, inputs), nothing later
ALSO_ALLOWED = {("samples", "load")}
TOP_MODULES = {"sbs_widget.testing", "sbs_widget.__main__"}


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, child.end_lineno + 1))
    return lines


def imports(name: str, path: pathlib.Path, known: set[str], typing_too: bool = False) -> set[str]:
    """Modules of the package that ``name`` imports, anywhere in it (typing-only imports aside, unless
    ``typing_too``)."""
    tree = ast.parse(path.read_text())
    typing_only = set() if typing_too else _type_checking_lines(tree)
    out = set()
    for node in ast.walk(tree):
        if node.lineno in typing_only if hasattr(node, "lineno") else False:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.add(full if full in known else node.module)
    return {m for m in out if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
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


def import_graph(typing_too: bool = False) -> dict[str, set[str]]:
    mods = modules()
    # the package root and sub-package __init__ files re-export their members: importing one of
    # their modules is not an import of the root, so the roots are left out of the graph
    return {name: imports(name, path, set(mods), typing_too) - {"sbs_widget"} for name, path in mods.items()
            if name != "sbs_widget"}


def test_no_import_cycle_inside_the_package():
    assert cycles(import_graph()) == [], "import cycles (lazy imports included)"


def test_no_cycles_including_typing_only():
    found = cycles(import_graph(typing_too=True))
    assert found == [], f"import cycles (lazy and typing-only imports included): {found}"


def folder(module: str) -> str:
    """The flow's name for a module's place: its folder, "base" or "top"."""
    parts = module.split(".")
    if len(parts) == 1 or module in TOP_MODULES:
        return "top"
    if (PACKAGE / parts[1]).is_dir():
        return "top" if parts[1] == "cli" else parts[1]
    return "base"


def against_the_flow(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for each import from a folder to one later in the flow."""
    return sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                  if RANK[folder(target)] > RANK[folder(name)]
                  and (folder(name), folder(target)) not in ALSO_ALLOWED)


def folder_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles between the folders of one layer (blame, deployed, dumps)."""
    between: dict[str, set[str]] = {}
    for name, targets in graph.items():
        for target in targets:
            a, b = folder(name), folder(target)
            if a != b and RANK[a] == RANK[b]:
                between.setdefault(a, set()).add(b)
                between.setdefault(b, set())
    return cycles(between)


def test_imports_follow_the_flow():
    mods = modules()
    graph = {name: imports(name, path, set(mods), typing_too=True) for name, path in mods.items()}
    assert set(map(folder, mods)) <= set(RANK), "a folder the flow does not place: add it to FLOW"
    wrong = against_the_flow(graph)
    assert wrong == [], "imports against the flow (" + " -> ".join("/".join(layer) for layer in FLOW) + \
        "):\n" + "\n".join(wrong)
    assert folder_cycles(graph) == [], "folders of one layer importing each other in a cycle"


def test_flow_check_finds_an_import_against_the_flow():
    graph = {"sbs_widget.align.pairs": {"sbs_widget.engine.fx_runner", "sbs_widget.load.onnx_index"},
             "sbs_widget.samples.zoo": {"sbs_widget.load.export"},
             "sbs_widget.errors": {"sbs_widget"}, "sbs_widget.testing": {"sbs_widget.cli.main"}}
    assert against_the_flow(graph) == ["sbs_widget.align.pairs -> sbs_widget.engine.fx_runner",
                                       "sbs_widget.errors -> sbs_widget"]
    assert folder_cycles({"sbs_widget.blame.a": {"sbs_widget.dumps.b"},
                          "sbs_widget.dumps.b": {"sbs_widget.blame.c"}}) == [["blame", "dumps"]]


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_over_the_size_one_reader_holds():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: split them along their concepts"


def long_functions(path: pathlib.Path, limit: int) -> list[str]:
    """``module:function (n lines)`` for each function (methods and nested ones too) over ``limit`` lines."""
    tree = ast.parse(path.read_text())
    return [f"{path.relative_to(PACKAGE.parent)}:{node.name} ({n} lines)" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (n := node.end_lineno - node.lineno + 1) > limit]


def test_no_function_over_the_size_one_reader_holds():
    long = [f for sub in ("engine", "align") for path in sorted((PACKAGE / sub).rglob("*.py"))
            for f in long_functions(path, MAX_FUNCTION_LINES)]
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: split them\n" + "\n".join(long)
