"""The bytecode cache (pyinit.bytecode): where an environment has no
bytecode and Python may not write it, a launch's imports are kept in a
folder of the user's, and later processes read them from there, never stale.

Whether Python read a module's bytecode or compiled its source is told by a
source changed after the bytecode was written, with its size and time put
back: the bytecode still answers with the old value. That is what Python's
own check (time and size) lets through, and it is the only trace a read
leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BIN_DIR

from pyinit import bytecode
from pyinit.analysis.timeline import read_events
from pyinit.errors import InputError

PYINIT = str(BIN_DIR / "pyinit")
TAG = sys.implementation.cache_tag


def package(root: Path, parts: int = 0) -> Path:
    """A package with no bytecode: ``nobc`` with a submodule, and `parts`
    more that its __init__ imports."""
    folder = root / "nobc"
    folder.mkdir(parents=True)
    imports = "".join(f"from nobc import p{n}\n" for n in range(parts))
    (folder / "__init__.py").write_text(f"{imports}VALUE = 1\n")
    (folder / "part.py").write_text("PART = 'a'\n")
    for n in range(parts):
        (folder / f"p{n}.py").write_text(f"N = {n}\n")
    return folder


def swapped_keeping_time_and_size(path: Path, old: str, new: str) -> None:
    """`path` now says `new` where it said `old`, of the same length, with
    the same modification time: only bytecode written before keeps `old`."""
    assert len(old) == len(new)
    info = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def environment(tmp_path: Path, cache: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PYTHONDONTWRITEBYTECODE="1",
               PYINIT_BYTECODE_CACHE=str(cache), **extra)  # fmt: skip
    env.pop(bytecode.PREFIX_ENV, None)
    return env


def python(env: dict[str, str], code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


FILL = """
import sys, time
import nobc, nobc.part
from pyinit import bytecode
filler = bytecode.fill_later({"nobc": nobc, "nobc.part": nobc.part}, worth=int(sys.argv[1]))
print(filler is not None)
if filler is not None:
    mark = bytecode.ready_mark(bytecode.folder())
    deadline = time.monotonic() + 60
    while not mark.exists() and filler.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    bytecode.end(filler)
"""


def test_a_launch_s_imports_are_kept_and_read_back_never_stale(tmp_path):
    source = package(tmp_path)
    cache = tmp_path / "cache"
    env = environment(tmp_path, cache)
    assert python(env, FILL, "3") == "False"  # two modules: not worth a cache
    assert not cache.exists()
    assert python(env, FILL, "2") == "True"
    assert not (source / "__pycache__").exists()  # nothing beside the sources
    assert cache.stat().st_mode & 0o777 == 0o700
    assert bytecode.ready_mark(cache).exists()
    assert Path(f"{cache}{source}/__init__.{TAG}.pyc").exists()  # the prefix's own layout
    swapped_keeping_time_and_size(source / "__init__.py", "VALUE = 1", "VALUE = 2")
    show = "import nobc, nobc.part; print(nobc.VALUE, nobc.part.PART)"
    with_cache = dict(env, PYTHONPYCACHEPREFIX=str(cache))
    assert python(with_cache, show) == "1 a"  # read from the cache
    assert python(env, show) == "2 a"  # compiled from the source
    # An edit Python can see (another size or second) is compiled again, never run stale.
    (source / "part.py").write_text("PART = 'bb'\n")
    assert python(with_cache, show) == "1 bb"


def test_nothing_is_kept_where_the_sources_have_their_own_bytecode(tmp_path):
    source = package(tmp_path)
    env = environment(tmp_path, tmp_path / "cache")
    python(dict(env, PYTHONDONTWRITEBYTECODE=""), "import nobc.part")  # written beside them
    assert (source / "__pycache__").is_dir()
    assert python(env, FILL, "1") == "False"
    assert not (tmp_path / "cache").exists()
    (source / "__pycache__" / f"part.{TAG}.pyc").unlink()
    assert python(dict(env, PYINIT_BYTECODE_CACHE="off"), FILL, "1") == "False"


def test_the_filler_copies_bytecode_a_source_has_and_compiles_the_rest(tmp_path):
    source = package(tmp_path)
    import py_compile

    timestamp = py_compile.PycInvalidationMode.TIMESTAMP
    own = py_compile.compile(str(source / "part.py"), doraise=True, invalidation_mode=timestamp)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    walked = [str(source / "__init__.py"), str(source / "part.py")]
    assert list(bytecode.walk(str(tmp_path / "nobc"))) == walked
    order = json.dumps({"imported": walked[1:], "packages": [str(source)]})
    done = subprocess.run([sys.executable, "-m", "pyinit.bytecode", str(cache)], input=order,
                          text=True, capture_output=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert Path(f"{cache}{source}/part.{TAG}.pyc").read_bytes() == Path(own).read_bytes()
    assert Path(f"{cache}{source}/__init__.{TAG}.pyc").exists()  # compiled from the walk
    assert bytecode.ready_mark(cache).exists()


def test_every_command_uses_a_ready_cache_and_leaves_the_user_s_own_alone(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setattr(sys, "pycache_prefix", None)
    env = {"PYINIT_BYTECODE_CACHE": str(cache)}
    assert bytecode.use(env) is None  # nothing kept yet
    bytecode.ready_mark(cache).parent.mkdir(parents=True)
    bytecode.ready_mark(cache).touch()
    cache.chmod(0o700)
    assert bytecode.use(dict(env, PYTHONPYCACHEPREFIX="/elsewhere")) is None
    assert sys.pycache_prefix is None
    assert bytecode.use(env) == cache
    assert sys.pycache_prefix == env["PYTHONPYCACHEPREFIX"] == str(cache)


@pytest.mark.parametrize("ready", [True, False])
def test_a_cache_others_could_write_is_refused_in_one_line(tmp_path, monkeypatch, capsys, ready):
    cache = tmp_path / "cache"
    bytecode.ready_mark(cache).parent.mkdir(parents=True)
    if ready:
        bytecode.ready_mark(cache).touch()
    cache.chmod(0o777)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    assert bytecode.use({"PYINIT_BYTECODE_CACHE": str(cache)}) is None
    assert sys.pycache_prefix is None
    assert capsys.readouterr().err == (
        f"pyinit: {cache}: the bytecode cache is refused: mode 0777 lets others in (0700 "
        "wanted); compiling from source\n")  # fmt: skip
    assert bytecode.fill_later({"os": os}, {"PYINIT_BYTECODE_CACHE": str(cache)}, worth=0) is None


def test_where_the_cache_is(monkeypatch):
    assert bytecode.folder({"HOME": "/home/u"}) == Path("/home/u/.cache/pyinit/bytecode")
    assert bytecode.folder({"HOME": "/home/u", "XDG_CACHE_HOME": "/c"}) == Path(
        "/c/pyinit/bytecode"
    )
    assert bytecode.folder({"XDG_CACHE_HOME": "rel"}) is None  # XDG: ignored
    assert bytecode.folder({"PYINIT_BYTECODE_CACHE": "off", "HOME": "/h"}) is None
    with pytest.raises(InputError, match="PYINIT_BYTECODE_CACHE='rel' is not an absolute path"):
        bytecode.folder({"PYINIT_BYTECODE_CACHE": "rel"})
    done = subprocess.run([PYINIT, "topo", "--help"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYINIT_BYTECODE_CACHE="rel"))  # fmt: skip
    assert (done.returncode, done.stderr) == (2, "pyinit: PYINIT_BYTECODE_CACHE='rel' is not an "
                                              "absolute path (a folder, or off)\n")  # fmt: skip


SHOW = """
import os, sys, time
from pathlib import Path
import nobc
from pyinit import bytecode
mark = bytecode.ready_mark(bytecode.folder())
deadline = time.monotonic() + 90
while not mark.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print(f"value {nobc.VALUE} ready {mark.exists()} prefix {os.environ.get('PYTHONPYCACHEPREFIX')}")
"""


@pytest.mark.slow
def test_a_cold_agent_keeps_its_imports_for_the_next_launch(tmp_path):
    """The agent's filler writes what it imported (the preload among it,
    enough modules to be worth a cache) while the script runs; the next
    launch's agent reads it from there."""
    source = package(tmp_path, parts=bytecode.WORTH_KEEPING)
    cache = tmp_path / "cache"
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    env = environment(tmp_path, cache)

    def launch(name: str) -> str:
        done = subprocess.run([PYINIT, "run", "--cold", "--nproc-per-node", "1", "--preload",
                               "nobc", "--run-dir", str(tmp_path / name), "--", str(script)],
                              env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    assert launch("first") == "value 1 ready True prefix None"
    swapped_keeping_time_and_size(source / "__init__.py", "VALUE = 1", "VALUE = 2")
    assert launch("second") == f"value 1 ready True prefix {cache}"


@pytest.mark.parametrize(("args", "stdin", "said"), [
    ([], "", "usage: python -m pyinit.bytecode CACHE"),
    (["relative"], "", "usage: python -m pyinit.bytecode CACHE"),
    (["/tmp/c"], "not json", "pyinit.bytecode: stdin: not a fill order"),
    (["/tmp/c"], '{"imported": []}', "pyinit.bytecode: stdin: not a fill order ('packages')"),
    (["/tmp/c"], '{"imported": [1], "packages": []}', "pyinit.bytecode: stdin: not a fill order"),
    (["/tmp/c"], "[]", "pyinit.bytecode: stdin: not a fill order"),
])  # fmt: skip
def test_a_bad_fill_order_is_one_line_and_exit_2(tmp_path, args, stdin, said):
    done = subprocess.run([sys.executable, "-m", "pyinit.bytecode", *args], input=stdin,
                          text=True, capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr


PREFIX = """
import os, sys
print(f"prefix {sys.pycache_prefix} env {os.environ.get('PYTHONPYCACHEPREFIX')}")
"""


def test_a_warm_interpreter_started_before_its_cache_was_ready_hands_it_on(tmp_path):
    """The first warm interpreter on a node starts before its filler made the
    cache ready; a later launch names the cache, and the workers forked for
    it read bytecode from there, as a fresh start with that launch's
    environment would."""
    cache = tmp_path / "cache"
    warm = tmp_path / "warm"
    warm.mkdir(mode=0o700)
    script = tmp_path / "prefix.py"
    script.write_text(PREFIX)
    env = environment(tmp_path, cache, PYINIT_WARM_DIR=str(warm), PYINIT_WARM="auto")
    started = subprocess.run([PYINIT, "warm", "start"], env=env, capture_output=True, text=True,
                             timeout=240)  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        # Made already where the environment has no bytecode of its own: the
        # warm interpreter's filler is then at work in it.
        cache.mkdir(mode=0o700, exist_ok=True)
        ready = bytecode.ready_mark(cache)
        ready.parent.mkdir(parents=True, exist_ok=True)
        ready.touch()
        done = subprocess.run([PYINIT, "run", "--nproc-per-node", "1", "--run-dir",
                               str(tmp_path / "run"), "--", str(script)], env=env,
                              capture_output=True, text=True, timeout=240)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        warm_events = [e for e in read_events(tmp_path / "run") if e["event"] == "warm"]
        assert warm_events and warm_events[0]["used"] is True
        assert done.stdout.strip().splitlines()[-1] == f"prefix {cache} env {cache}"
    finally:
        subprocess.run([PYINIT, "warm", "stop"], env=env, capture_output=True, timeout=60)


READY_THEN_FAIL = """
import os, sys
from pyinit import bytecode
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    cache = bytecode.folder()
    # Made already by the agent's filler where the environment has no bytecode.
    cache.mkdir(mode=0o700, exist_ok=True)
    bytecode.ready_mark(cache).parent.mkdir(parents=True, exist_ok=True)
    bytecode.ready_mark(cache).touch()
    sys.exit(1)
print(f"prefix {sys.pycache_prefix} env {os.environ.get('PYTHONPYCACHEPREFIX')}")
"""


def test_a_restarted_group_reads_a_cache_that_became_ready_during_the_run(tmp_path):
    """A cold agent started before the cache was ready (its own filler makes
    it so on a fresh node): the group it forks at a restart reads from it."""
    cache = tmp_path / "cache"
    script = tmp_path / "ready_then_fail.py"
    script.write_text(READY_THEN_FAIL)
    env = environment(tmp_path, cache)
    done = subprocess.run([PYINIT, "run", "--cold", "--nproc-per-node", "1", "--max-restarts",
                           "1", "--run-dir", str(tmp_path / "run"), "--", str(script)], env=env,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == f"prefix {cache} env {cache}"


# prometheus-client as the monitor imports it to write a node_exporter
# textfile: one module, here with `padding` bytes of comments, whose VALUE
# says which source ran.
STAND_IN_PROMETHEUS = """
VALUE = 1
class _Metric:
    def __init__(self, *args, **kwargs):
        pass
    def labels(self, *values):
        return self
    def set(self, value):
        pass
    def inc(self):
        pass
    def clear(self):
        pass
CollectorRegistry = Counter = Gauge = _Metric
def write_to_textfile(path, registry):
    with open(path, "w") as out:
        out.write(f"stand-in {VALUE}")
"""


@pytest.mark.parametrize(("padding", "kept"), [(300 << 10, True), (30 << 10, False)])
def test_a_command_keeps_its_imports_bytecode_when_compiling_them_costs(tmp_path, padding, kept):
    """A command run without the cache that compiled at least
    WORTH_KEEPING_BYTES of source keeps that bytecode and marks the cache
    ready; its next start reads it from there. A few small modules do not."""
    (tmp_path / "prometheus_client.py").write_text(STAND_IN_PROMETHEUS + "#" * padding + "\n")
    cache = tmp_path / "cache"
    env = environment(tmp_path, cache)
    textfile = tmp_path / "metrics.prom"
    monitor = [PYINIT, "monitor", "--once", "--json", "--textfile", str(textfile)]

    def said() -> str:
        done = subprocess.run(monitor, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return textfile.read_text()

    assert said() == "stand-in 1"
    assert bytecode.ready_mark(cache).exists() is kept
    assert not (tmp_path / "__pycache__").exists()
    swapped_keeping_time_and_size(tmp_path / "prometheus_client.py", "VALUE = 1", "VALUE = 2")
    assert said() == ("stand-in 1" if kept else "stand-in 2")
