"""The core names no device: AMD's and Graphcore's backends (plugins/polyprof-rocm, polyprof-ipu) came
with no change under src/polyprof, and no word of theirs is there (DESIGN.md: "the core names no
device")."""

import re
from pathlib import Path

import polyprof

CORE = Path(polyprof.__file__).parent
WORDS = re.compile(r"\b(rocm|amdsmi|rocprofiler|roctracer|hip|poplar|popvision|libpva|ipu|ipus)\b", re.IGNORECASE)


def test_no_word_of_the_rocm_or_ipu_plugins_in_the_core():
    hits = []
    for path in list(CORE.rglob("*.py")) + list(CORE.rglob("*.c")) + list(CORE.rglob("*.h")) + list(CORE.rglob("*.cpp")):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if WORDS.search(line):
                hits.append(f"{path.relative_to(CORE)}:{n}: {line.strip()}")
    assert hits == []


def test_both_plugins_are_found_at_run_time_with_their_reasons():
    from polyprof.engine.registry import Registry

    registry = Registry()
    entries = {e.name: e for e in registry.entries()}
    assert {"amdsmi", "ipu"} <= set(entries), "scripts/setup.sh installs every plugin under plugins/"
    ipu, amd = registry.probe(entries["ipu"]), registry.probe(entries["amdsmi"])
    assert ipu.available or "Poplar SDK" in ipu.reason  # this machine has neither stack: the reasons show
    assert amd.available or "ROCm" in amd.reason
