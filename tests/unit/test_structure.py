"""The package's shape: no import cycles among its modules (imports inside functions included, and imports made by
string: `importlib.import_module("posttrainllm.x")`, `import_module(f"posttrainllm.commands.{name}")` and
"posttrainllm.x:attr" paths)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import posttrainllm

PKG = Path(posttrainllm.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(name: str, modules) -> str | None:
    """The project module `name` refers to (a name inside a module resolves to the module)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


# "posttrainllm.x.y:attr": an object named by import path (spec.py's `load`), an import of posttrainllm.x.y
_ATTR_PATH = re.compile(r"(posttrainllm(?:\.\w+)*):\w+(?:\.\w+)*")


def _string_imports(node: ast.AST) -> list[str]:
    """The modules `node` imports by string: `import_module("posttrainllm.x")` (any callee named import_module), an
    f-string's literal prefix (`import_module(f"posttrainllm.commands.{name}")`: the package it names,
    posttrainllm.commands), or a "posttrainllm.x:attr" string constant."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        m = _ATTR_PATH.fullmatch(node.value)
        return [m.group(1)] if m else []
    if not isinstance(node, ast.Call) or not node.args:
        return []
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name != "import_module":
        return []
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr) and arg.values:
        first = arg.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and "." in first.value:
            return [first.value.rpartition(".")[0]]  # "posttrainllm.commands.{x}" -> posttrainllm.commands
    return []


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its body (functions, classes, TYPE_CHECKING blocks too),
    by statement or by string (`_string_imports`)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = _string_imports(node)
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                found = _resolve(t, modules)
                # a package's __init__ re-exporting its own submodules is not a cycle through the package itself
                if found and found != mod:
                    graph[mod].add(found)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _is_package_edge(a: str, b: str) -> bool:
    """`a` is a package and `b` one of its own submodules (or the reverse): `pkg/__init__` importing its parts."""
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_the_import_graph_finder_sees_imports_inside_functions(tmp_path):
    tree = ast.parse("def f():\n    from posttrainllm import errors\n")
    assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(tree))
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_finder_sees_imports_made_by_string():
    def found(code: str) -> list[str]:
        return [t for n in ast.walk(ast.parse(code)) for t in _string_imports(n)]

    assert found('importlib.import_module("posttrainllm.demo")') == ["posttrainllm.demo"]
    assert found('from importlib import import_module\nimport_module("posttrainllm.x.y")') == ["posttrainllm.x.y"]
    assert found('importlib.import_module(f"posttrainllm.commands.{c}")') == ["posttrainllm.commands"]
    assert found('TRAINER = "posttrainllm.training.trainers:Sft"') == ["posttrainllm.training.trainers"]
    assert found('x = "trl:SFTTrainer"; y = "posttrainllm.models"; importlib.import_module(name)') == []
    modules = _modules()
    assert _resolve("posttrainllm.commands", modules) == "posttrainllm.commands"


def test_no_import_cycles_among_project_modules():
    graph = import_graph()
    # a package's __init__ may import its submodules; a submodule importing the package's __init__ is a cycle only
    # if it goes through some other module, so drop the direct package <-> own-submodule edges
    graph = {a: {b for b in deps if not _is_package_edge(a, b)} for a, deps in graph.items()}
    cycles = find_cycles(graph)
    assert cycles == [], f"import cycles among project modules: {cycles}"


# the command level: the CLI, the commands, and the sweep (which runs commands); every other room is shared and gets
# a command's spec handed in (posttrainllm/spec.py), never by importing posttrainllm/commands/
COMMAND_LEVEL = ("posttrainllm.cli", "posttrainllm.__main__", "posttrainllm.commands", "posttrainllm.sweep")


def test_the_shared_rooms_import_nothing_from_commands():
    graph = import_graph()
    level = tuple(p + "." for p in COMMAND_LEVEL)
    shared = {m for m in graph if m not in COMMAND_LEVEL and not m.startswith(level)}
    assert "posttrainllm.config.resolve" in shared and "posttrainllm.lifecycle" in shared
    reaching = {m: sorted(d for d in deps if d.startswith("posttrainllm.commands")) for m, deps in graph.items()}
    assert {m: d for m, d in reaching.items() if m in shared and d} == {}


def test_the_checkout_holds_no_leftover_data_files():
    """b.jsonl / s.jsonl (32.8 MB of filler) once sat at the repository root, used by nothing."""
    root = PKG.parent
    assert not [p.name for p in root.glob("*.jsonl")]
    assert not [p.name for p in root.glob("*.json")]


def test_the_checkout_listing_sees_a_new_file(tmp_path):
    from conftest import checkout_listing

    (tmp_path / "a").mkdir()
    before = checkout_listing(tmp_path)
    (tmp_path / "a" / "left.jsonl").write_text("{}\n")
    (tmp_path / "__pycache__").mkdir()
    assert checkout_listing(tmp_path) - before == {"a/left.jsonl"}


# --------------------------------------------------------------------------------------------- small rooms
MAX_LOOSE_MODULES = 12  # the package root holds the run's core; everything else lives in a room (a subpackage)


def test_the_package_root_holds_at_most_12_loose_modules():
    loose = sorted(p.name for p in PKG.glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, (
        f"{len(loose)} modules in posttrainllm/ (at most {MAX_LOOSE_MODULES}): {loose}"
    )


MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
# data tables, not logic: allowed to be long (keep this list short)
LONG_DATA_TABLES: set[str] = set()


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_product_module_is_over_500_lines():
    long = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    over = {m: n for m, n in long.items() if n > MAX_MODULE_LINES and m not in LONG_DATA_TABLES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_is_over_80_lines():
    over = {}
    for mod, path in _modules().items():
        for fn in _functions(ast.parse(path.read_text())):
            n = fn.end_lineno - fn.lineno + 1
            if n > MAX_FUNCTION_LINES and f"{mod}.{fn.name}" not in LONG_DATA_TABLES:
                over[f"{mod}.{fn.name}"] = n
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"
