"""polyprof._native is the one door to the C extension: both sides export the same names, nothing else
in polyprof imports the extension or asks whether it loaded, and without it every accelerator declines
so that its caller's reference path runs."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import polyprof._native as native
from polyprof._native import python as python_side

SRC = pathlib.Path(native.__file__).parents[1]


def test_both_sides_export_every_name_of_the_door():
    assert python_side.__all__ == list(native.SIDE_NAMES)
    assert all(hasattr(python_side, name) for name in native.SIDE_NAMES)
    assert all(hasattr(native, name) for name in native.SIDE_NAMES)
    if native.extension is not None:
        from polyprof._native import c

        assert c.__all__ == list(native.SIDE_NAMES) and all(hasattr(c, name) for name in native.SIDE_NAMES)


def _modules_outside_the_door():
    for path in sorted(SRC.rglob("*.py")):
        if "_native" not in path.relative_to(SRC).parts:
            yield path, ast.parse(path.read_text())


def test_nothing_outside_the_door_imports_the_extension_or_asks_whether_it_loaded():
    found = []
    for path, tree in _modules_outside_the_door():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_speedups"):
                found.append(f"{path}: imports {node.module}")
            if isinstance(node, ast.ImportFrom) and any(a.name in ("_speedups", "extension", "EXTENSION") for a in node.names):
                found.append(f"{path}: imports {', '.join(a.name for a in node.names)} from {node.module}")
            if isinstance(node, ast.Attribute) and node.attr in ("extension", "EXTENSION") and getattr(node.value, "id", "") == "_native":
                found.append(f"{path}:{node.lineno}: reads _native.{node.attr}")
    assert found == []


def test_without_the_extension_every_accelerator_declines():
    ints = np.arange(4, dtype=np.int64)
    assert python_side.ordered_rows(ints, np.ones(4, bool)) is None
    assert python_side.interleave_ordered(ints, ints, ints, ints) is None
    assert python_side.take_two(ints, ints, ints) is None
    assert python_side.innermost_open(ints, ints, ints.astype(np.int32), ints, ints) is None
    assert python_side.encode_events(None, None, None, 0, 0) is None and python_side.encode_json_args(ints, (), [], []) is None
    assert python_side.events_array_start(b'{"traceEvents": [') == native.DECLINED
    assert python_side.scan_events(b"[]", 0, True, []) == native.DECLINED
    assert python_side.scan_packets(b"") is None and python_side.packet_rewriter(0, 0, 0, 0, 0, b"", 1) is None
    with pytest.raises(native.NeedsExtension, match="needs polyprof's C extension"):
        python_side.pytrace_start()


def test_the_writers_twins_give_what_c_gives():
    """The Python twins of the writers' event formatters stand in for C where it is not built: the same
    bytes (the Chrome formatter is compared on its widest rows in tests/formats/test_export_chrome.py).
    Fixed seed."""
    track = np.array([0, 0, 1, 0], dtype=np.int64)
    start = np.array([0, 5, 1, 10], dtype=np.int64)
    end = np.array([20, 8, 4, 10], dtype=np.int64)
    instant = np.array([0, 0, 0, 1], dtype=np.int8)
    order = np.argsort(start, kind="stable").astype(np.int64)
    events, lanes = python_side.slice_events(track, start, end, instant, order)
    # row << 2 | phase (0 begin, 1 end, 2 instant), in time order: a row ends before a later one begins
    assert np.frombuffer(events, np.int64).tolist() == [0, 8, 9, 4, 5, 14, 1]
    rng = np.random.default_rng(66)
    n = 500
    ext = rng.integers(0, 3, n).astype(np.int64) * 7
    corr = rng.integers(0, 2, n).astype(np.int64) * -(2**62)
    floats = rng.choice([0.1, -2.5e-300, 1e16, 3.0, np.nan, np.inf, -np.inf, 123456789.125], n)
    encoded = [(b"" if i % 5 == 0 else b'{"a":[1,"\\u00e9"]}') for i in range(n)]
    columns = [rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64), floats.astype(np.float64), encoded]
    keys = [b'"grid"', b'"scale"', b'"more"']
    ext[0] = corr[0] = 0
    objects = python_side.format_arg_objects(ext, corr, keys, columns)
    scale = repr(float(floats[0])).encode() if np.isfinite(floats[0]) else b"null"
    assert objects[0] == b'{"grid":%d,"scale":%s}' % (int(columns[0][0]), scale)  # no ids; "more" empty: left out
    if native.extension is not None:
        from polyprof._native import c

        assert c.slice_events(track, start, end, instant, order) == (events, lanes)
        assert c.format_arg_objects(ext, corr, keys, columns) == objects


def test_the_python_columns_give_what_c_gives():
    values = ["a", None, "b", "a", 3, None, ("t",), 3]
    codes, table = python_side.code_strings(values)
    assert [table[c] for c in codes.tolist()] == values and table == ["a", None, "b", 3, ("t",)]
    assert python_side.present_rows(values).tolist() == [0, 2, 3, 4, 6, 7]
    if native.extension is not None:
        from polyprof._native import c

        c_codes, c_table = c.code_strings(values)
        assert c_codes.tolist() == codes.tolist() and c_table == table
        assert c.present_rows(values).tolist() == python_side.present_rows(values).tolist()


def test_the_stub_names_what_the_extension_exports():
    """src/polyprof/_native/_speedups.pyi is the extension's signature for type checkers and readers: the same names."""
    extension = native.load.extension
    if extension is None:
        pytest.skip("needs the C extension (built by pip install; this install has none)")
    stub = ast.parse((SRC / "_native" / "_speedups.pyi").read_text())
    named = set()
    for node in stub.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            named.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            named.add(node.target.id)
        elif isinstance(node, ast.Assign):
            named.update(t.id for t in node.targets if isinstance(t, ast.Name))
    exported = {name for name in dir(extension) if not name.startswith("__")}
    assert exported - named == set(), "in the extension, not in the stub"
    assert named - exported == set(), "in the stub, not in the extension"
