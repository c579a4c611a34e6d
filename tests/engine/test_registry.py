import sys
import textwrap

import pytest

import polyprof
from polyprof.engine.registry import Registry
from polyprof.errors import BackendConflictError, BackendContractError, UnknownNameError
from polyprof.plugin import BackendTraits, SessionTraits

PLUGIN_SOURCE = """
from polyprof.plugin.backend import API_VERSION, Availability

class Backend:
    api_version = {api_version}
    def __init__(self, name, groups):
        self.name = name
        self.activities = frozenset(groups)
    def probe(self):
        return Availability.yes(devices=["fake device"])
    def create_session(self, config, ctx):
        raise RuntimeError("not used")

backend = Backend({name!r}, {groups!r})
"""


def make_dist(root, dist, module, name, groups, *, api_version="API_VERSION", declare=True, source=None):
    """A real installed distribution on sys.path: a dist-info folder with entry points and a module."""
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    eps = f"[polyprof.backends]\n{name} = {module}:backend\n"
    if declare:
        eps += "[polyprof.activities]\n" + "".join(f"{g}.{name} = {module}:backend\n" for g in groups)
    (info / "entry_points.txt").write_text(eps)
    (root / f"{module}.py").write_text(
        source
        if source is not None
        else PLUGIN_SOURCE.format(api_version=api_version, name=name, groups=list(groups))
    )


@pytest.fixture
def plugin_root(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith("fakeplug_")]:
        del sys.modules[mod]


def test_built_in_host_backend_comes_from_an_entry_point():
    entry = Registry(use_env=False).get("host")
    assert entry.distribution == "polyprof" and entry.origin == "entry point"
    assert entry.activities == {"CPU"}


def test_plugins_are_imported_only_when_their_activity_is_needed(plugin_root):
    make_dist(plugin_root, "polyprof-fakea", "fakeplug_a", "fakea", ["FAKEA"])
    reg = Registry(use_env=False)
    prof = polyprof.profile(["cpu"], registry=reg)
    assert set(prof.backends) <= {"host", "torch"} and "host" in prof.backends
    assert "fakeplug_a" not in sys.modules, "a profile of CPU must not import an unrelated plugin"
    found = reg.for_activities(["fakea"])
    assert "fakeplug_a" in sys.modules
    assert [e.name for e in found["FAKEA"]] == ["fakea"]
    assert found["FAKEA"][0].source == "polyprof-fakea 1.0"


def test_listing_imports_every_plugin(plugin_root):
    make_dist(plugin_root, "polyprof-fakeb", "fakeplug_b", "fakeb", ["FAKEB"])
    names = {e.name: e for e in Registry(use_env=False).entries()}
    assert names["fakeb"].loaded and "fakeplug_b" in sys.modules


def test_plugin_that_fails_to_import_is_listed_as_broken_and_the_rest_works(plugin_root):
    make_dist(
        plugin_root,
        "polyprof-bad",
        "fakeplug_bad",
        "bad",
        ["BAD"],
        source="raise ImportError('libfoo.so missing')\n",
    )
    reg = Registry(use_env=False)
    entry = {e.name: e for e in reg.entries()}["bad"]
    assert entry.broken and "libfoo.so missing" in entry.error
    with polyprof.profile(["cpu"], registry=reg) as prof:
        with polyprof.record_function("still works"):
            pass
    assert prof.trace.activities.row(0).name == "still works"
    with pytest.raises(
        polyprof.BackendUnavailableError,
        match="activity BAD cannot be profiled here: bad: import of fakeplug_bad:backend failed: ImportError: libfoo.so missing",
    ):
        polyprof.profile(["bad"], registry=reg)


def test_wrong_api_version_is_broken_with_the_reason(plugin_root):
    make_dist(plugin_root, "polyprof-future", "fakeplug_future", "future", ["FUTURE"], api_version="99")
    entry = {e.name: e for e in Registry(use_env=False).entries()}["future"]
    assert entry.broken and "api_version 99 is not supported" in entry.error


def test_declared_activities_must_match_the_backend(plugin_root):
    make_dist(
        plugin_root,
        "polyprof-liar",
        "fakeplug_liar",
        "liar",
        ["LIAR"],
        source=PLUGIN_SOURCE.format(api_version="API_VERSION", name="liar", groups=["OTHER"]),
    )
    entry = {e.name: e for e in Registry(use_env=False).entries()}["liar"]
    assert entry.broken and "declares activity groups ['LIAR']" in entry.error


def test_two_distributions_with_one_backend_name_is_a_clear_error_naming_both(plugin_root):
    make_dist(plugin_root, "polyprof-one", "fakeplug_one", "twin", ["TWIN"])
    make_dist(plugin_root, "polyprof-two", "fakeplug_two", "twin", ["TWIN"])
    reg = Registry(use_env=False)
    with pytest.raises(BackendConflictError) as err:
        reg.get("twin")
    assert "polyprof-one 1.0" in str(err.value) and "polyprof-two 1.0" in str(err.value)
    with pytest.raises(BackendConflictError):
        polyprof.profile(["twin"], registry=reg)
    listed = [e for e in reg.entries() if e.conflict]
    assert len(listed) == 2
    polyprof.profile(["cpu"], registry=reg)  # the conflict does not affect other profiles


def test_environment_variable_registers_backends(plugin_root, monkeypatch):
    (plugin_root / "fakeplug_env.py").write_text(
        PLUGIN_SOURCE.format(api_version="API_VERSION", name="envy", groups=["ENVY"])
    )
    monkeypatch.setenv("POLYPROF_BACKENDS", "fakeplug_env:backend")
    reg = Registry()
    entry = reg.get("envy")
    assert entry.origin == "POLYPROF_BACKENDS" and entry.loaded
    monkeypatch.setenv("POLYPROF_BACKENDS", "fakeplug_nonexistent:backend")
    broken = {e.name: e for e in Registry().entries()}["fakeplug_nonexistent:backend"]
    assert "No module named 'fakeplug_nonexistent'" in broken.error


def test_register_backend_checks_the_contract():
    reg = Registry(use_entry_points=False, use_env=False)

    class NoProbe:
        name, api_version, activities = "np", 1, frozenset({"X"})

        def create_session(self, config, ctx): ...

    with pytest.raises(BackendContractError, match="backend 'np': cannot be registered: missing attribute 'probe'") as err:
        reg.register(NoProbe())
    assert err.value.backend == "np"

    from fake_backends import SimDeviceBackend

    a, b = SimDeviceBackend(), SimDeviceBackend()
    reg.register(a)
    reg.register(a)  # the same object again is fine
    with pytest.raises(ValueError, match="already registered"):
        reg.register(b)


def test_unknown_activity_lists_known_ones_and_a_close_match(registry):
    with pytest.raises(UnknownNameError) as err:
        polyprof.profile(["cpuu"], registry=registry)
    msg = str(err.value)
    assert "Did you mean 'CPU'?" in msg and "CPU, CUDA" in msg.split("Known activities: ")[1]


def test_unknown_backend_name_lists_known_ones(registry):
    with pytest.raises(UnknownNameError, match="Did you mean 'host'"):
        registry.get("hots")


def test_plugin_module_source_is_readable():
    # sanity check that the template renders valid Python
    compile(textwrap.dedent(PLUGIN_SOURCE.format(api_version=1, name="x", groups=["X"])), "x", "exec")


def _backend_declaring(**attributes):
    from fake_backends import SimDeviceBackend

    backend = SimDeviceBackend()
    for name, value in attributes.items():
        setattr(backend, name, value)
    return backend


def test_a_backend_declares_its_traits_in_one_checked_object():
    reg = Registry(use_entry_points=False, use_env=False)
    with pytest.raises(BackendContractError, match=r"'in_process' is given as an attribute: declare it as "
                       r"traits = BackendTraits\(in_process=True\)"):
        reg.register(_backend_declaring(in_process=True))
    with pytest.raises(BackendContractError, match="traits must be a polyprof.plugin.BackendTraits, got dict"):
        reg.register(_backend_declaring(traits={"in_process": True}))
    with pytest.raises(BackendContractError, match="traits.on_by_default must be True or False, got 'no'"):
        reg.register(_backend_declaring(traits=BackendTraits(on_by_default="no")))
    with pytest.raises(BackendContractError, match="traits.facilities must be a frozenset of names"):
        reg.register(_backend_declaring(traits=BackendTraits(facilities={"CUPTI"})))
    entry = reg.register(_backend_declaring(traits=BackendTraits(facilities=frozenset({"CUPTI"}), on_by_default=False)))
    assert entry.backend.traits.described() == ["only when named", "takes CUPTI"]


def test_a_session_with_a_loose_trait_fails_its_backend_naming_the_fix(monkeypatch, registry):
    from fake_backends import SimDeviceBackend, SimDeviceSession

    class LooseSession(SimDeviceSession):
        thread_affine = True

    class Declared(SimDeviceSession):
        traits = SessionTraits(thread_affine=True)

    backend = SimDeviceBackend()
    making = []
    monkeypatch.setattr(backend, "create_session", lambda config, ctx: making[-1](ctx))
    registry.register(backend)
    for session_class, ok in ((LooseSession, False), (Declared, True)):
        making.append(session_class)
        with polyprof.profile(["cpu", "simdev"], registry=registry) as prof:
            backend.launch("k")
        status = prof.trace.backends[backend.name]
        if ok:
            assert status.state == "ran", status.errors
        else:
            assert status.state == "failed"
            assert "its session 'thread_affine' is given as an attribute: declare it as traits = SessionTraits(thread_affine=True)" in " ".join(status.errors)


def test_polyprof_backends_shows_each_backends_traits():
    import subprocess

    r = subprocess.run([sys.executable, "-m", "polyprof", "backends"], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "COLUMNS": "250"})
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if "┃ Name" in line)
    traits_column = [c.strip() for c in header.split("┃")].index("Traits")
    traits, name = {}, None
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > traits_column:
            name = cells[1] or name  # a row's cells wrap onto lines whose first cell is empty
            traits[name] = f"{traits.get(name, '')} {cells[traits_column]}".strip()
    assert traits["python"] == "in process, only when named"
    assert traits["host"] == "in process, context-scoped spans"
