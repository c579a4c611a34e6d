"""What the layout promises a newcomer (issue #52): polyprof's modules import one another without
circles, no module takes another's private names (imported, or reached as a module's attribute), and
one package chooses between C and Python; no function or file grows past what one sitting reads."""

import ast
import os
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(__file__), "..")
SRC = os.path.join(ROOT, "src")
#: polyprof-internal packages whose names are public inside polyprof (the underscore keeps them out
#: of the public API), and the C extension, which only polyprof._native imports
INTERNAL = ("_native", "_speedups", "_version")


def _modules():
    """{dotted name: path} of every module under src/polyprof."""
    found = {}
    for dirpath, _, files in os.walk(os.path.join(SRC, "polyprof")):
        for f in files:
            if f.endswith(".py"):
                name = os.path.relpath(os.path.join(dirpath, f), SRC)[:-3].replace(os.sep, ".")
                found[name.removesuffix(".__init__")] = os.path.join(dirpath, f)
    return found


MODULES = _modules()
EXTENSIONS = {"polyprof._native._speedups"}


def _imports(name, path):
    """(imported module, imported name or None) for every import in the module, function-level ones
    included (a lazy import still ties the two modules)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            yield from ((a.name, None) for a in node.names if a.name.startswith("polyprof"))
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base) if node.level else node.module or ""
            if target.startswith("polyprof"):
                for alias in node.names:
                    yield target, alias.name


def _edges():
    edges = defaultdict(set)
    for name, path in MODULES.items():
        for target, imported in _imports(name, path):
            full = f"{target}.{imported}" if imported else target
            to = full if full in MODULES or full in EXTENSIONS else target
            if to != name and (to in MODULES or to in EXTENSIONS):
                edges[name].add(to)
    return edges


def _package(module):
    """polyprof.store.query -> polyprof.store; a root module is its own (polyprof.plugin.sink)."""
    return ".".join(module.split(".")[:2])


def _package_edges():
    """{package: {packages it imports}}, with one module that does so for each (to name in a failure)."""
    edges, why = defaultdict(set), {}
    for name, targets in _edges().items():
        for target in targets:
            a, b = _package(name), _package(target)
            if a != b:
                edges[a].add(b)
                why.setdefault((a, b), f"{name} -> {target}")
    return edges, why


def _cycles(edges, nodes=None):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
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
                out.append(sorted(component))

    for v in sorted(nodes if nodes is not None else MODULES):
        if v not in index:
            visit(v)
    return out


def test_no_two_modules_import_each_other_even_through_others():
    assert _cycles(_edges()) == []


def test_the_packages_are_layers_none_imports_one_that_imports_it_back():
    """Folders in dependency order: the model and the contract at the bottom, then the merge, the formats,
    the analyses and the store, with the engine, the backends and the front ends above; a package that
    needs one above it ties them in a knot, named here by one import of each edge in it."""
    edges, why = _package_edges()
    knots = _cycles(edges, {_package(m) for m in MODULES})
    assert knots == [], [[why[(a, b)] for a in knot for b in knot if (a, b) in why] for knot in knots]


def test_nothing_outside_the_backends_imports_one():
    """Backends are found through their entry points; what the engine and the front ends share with the
    torch backend is polyprof.torch's, what the host backend and the crash reader share is plugin's."""
    outside = sorted(f"{name} -> {target}" for name, targets in _edges().items() for target in targets
                     if target.startswith("polyprof.backends") and not name.startswith("polyprof.backends"))
    assert outside == []


def test_no_module_takes_another_modules_private_names():
    private = [
        (name, f"{target}.{imported}")
        for name, path in MODULES.items()
        for target, imported in _imports(name, path)
        if imported and imported.startswith("_") and not imported.startswith("__") and imported not in INTERNAL
        and target != name
    ]
    assert private == []


def _module_aliases(name, path, tree):
    """{local name: polyprof module} for the modules `name` imports as names (``import polyprof.x as W``,
    ``from polyprof.formats.perfetto import write``)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update((a.asname, a.name) for a in node.names if a.name.startswith("polyprof") and a.asname)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base) if node.level else node.module or ""
            aliases.update((a.asname or a.name, f"{target}.{a.name}") for a in node.names if f"{target}.{a.name}" in MODULES)
    return aliases


def test_no_module_reaches_another_modules_private_names_as_attributes():
    reached = set()
    for name, path in MODULES.items():
        tree = ast.parse(open(path).read(), path)
        aliases = _module_aliases(name, path, tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                module, attr = aliases[node.value.id], node.attr
                if attr.startswith("_") and not attr.startswith("__") and attr not in INTERNAL and module != name:
                    reached.add((name, f"{module}.{attr}"))
    assert sorted(reached) == []


def test_only_polyprof_native_chooses_between_c_and_python():
    edges = _edges()
    choosers = sorted(
        name
        for name, path in MODULES.items()
        if not name.startswith("polyprof._native")
        and (any(to in EXTENSIONS for to in edges.get(name, ())) or "POLYPROF_PURE_PYTHON" in open(path).read())
    )
    assert choosers == []


#: the sizes a newcomer can read in one sitting (issue #66): a function fits a screen or two, a file
#: is one job. A function past them is split by what it does; a file, by the jobs it holds.
LONGEST_FUNCTION, LONGEST_FILE = 80, 500


def test_every_function_and_file_stays_readable_in_one_sitting():
    long_functions, long_files = [], []
    for name, path in MODULES.items():
        source = open(path).read()
        if source.count("\n") > LONGEST_FILE:
            long_files.append(f"{name}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source, path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long_functions.append(f"{name}.{node.name}: {lines} lines")
    assert not long_files, f"files over {LONGEST_FILE} lines: {long_files}"
    assert not long_functions, f"functions over {LONGEST_FUNCTION} lines: {long_functions}"
