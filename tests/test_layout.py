"""What the architecture promises about imports: the core names no device library, plugins use only
polyprof's public plugin module, and importing polyprof for record_function alone stays light."""

import ast
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
CORE = os.path.join(ROOT, "src", "polyprof")
PLUGINS = os.path.join(ROOT, "plugins")
DEVICE_LIBRARIES = ("pyopencl", "cupti", "cuda", "pti", "intel_pti", "level_zero", "rocprofiler", "hip")
#: what a plugin may import of polyprof: the plugin module, and the user-facing front ends (docs, tests)
PUBLIC_FOR_PLUGINS = ("polyprof.plugin", "polyprof.profiler", "polyprof.testing")


def _imports(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def _python_files(folder):
    for dirpath, _, files in os.walk(folder):
        yield from (os.path.join(dirpath, f) for f in files if f.endswith(".py"))


def test_the_core_imports_no_device_library():
    found = [
        (os.path.relpath(p, ROOT), m)
        for p in _python_files(CORE)
        for m in _imports(p)
        if m.split(".")[0] in DEVICE_LIBRARIES
    ]
    assert found == []


def test_the_core_c_code_knows_no_device_api():
    words = ("NannyEvent", "clRetainEvent", "int_ptr", "cupti", "CUpti", "pti_view")
    csrc = os.path.join(CORE, "_native", "csrc")
    files = [os.path.join(folder, f) for folder, _, names in os.walk(csrc) for f in names]  # the sections too
    assert any(f.endswith(".c.h") for f in files)
    found = [(f, w) for f in files for w in words if w in open(f).read()]
    assert found == []


@pytest.mark.parametrize("plugin", sorted(d for d in os.listdir(PLUGINS) if os.path.isdir(os.path.join(PLUGINS, d, "src"))))
def test_plugins_import_only_polyprofs_public_plugin_module(plugin):
    private = [
        (os.path.relpath(p, ROOT), m)
        for p in _python_files(os.path.join(PLUGINS, plugin, "src"))
        for m in _imports(p)
        if (m == "polyprof" or m.startswith("polyprof.")) and not m.startswith(PUBLIC_FOR_PLUGINS)
    ]
    assert private == []


def test_record_function_alone_imports_neither_numpy_nor_the_engine():
    code = (
        "import sys, json, polyprof\n"
        "with polyprof.record_function('x'):\n    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'orjson', 'polyprof'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    modules = json.loads(out)
    assert not [m for m in modules if m.startswith(("numpy", "orjson", "polyprof.engine", "polyprof.model"))], modules
    assert "polyprof.annotations" in modules


def code_lines(path: str) -> int:
    """Lines of code: not blank, not a comment, not part of a docstring."""
    src = open(path).read()
    docstrings = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node):
            docstrings.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    return sum(
        1 for i, line in enumerate(src.splitlines(), 1) if line.strip() and not line.strip().startswith("#") and i not in docstrings
    )


def test_the_reference_plugin_stays_small_enough_to_copy():
    """polyprof-opencl is the example a vendor copies: under 500 lines of code (its docstrings, which
    explain it, are not counted)."""
    folder = os.path.join(PLUGINS, "polyprof-opencl", "src", "polyprof_opencl")
    total = sum(code_lines(p) for p in _python_files(folder))
    assert total < 500, total
