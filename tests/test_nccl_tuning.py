"""pyinit nccl --tune's search, cache key, table and application, on recorded
timings: the choices are plain data, so a table recorded on a 2xH200 node
gives the same choices here. The measurement itself needs the GPUs
(tests/test_nccl_gpu.py); the plugin's own answers are csrc/nccl/tests'."""

from __future__ import annotations

import json
import math
import os
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyinit import _native
from pyinit.errors import InputError
from pyinit.nccl import configure
from pyinit.nccl.tuning import (
    DEFAULT,
    NOISE_FLOOR,
    TABLE_ENV,
    Candidate,
    NodeKind,
    Timings,
    choose,
    node_kind,
    plot_tuning,
    plugin_path,
    plugin_run_env,
    read_table,
    write_table,
)
from pyinit.nccl.tuning_cache import cached, find, store
from pyinit.nvml import FakeNvml, read_nvml
from pyinit.topology import scan

DATA = Path(__file__).parent / "data"
ISSUE_TABLE = DATA / "nccl-tuning/h200x2-nccl-tests.json"
H200X2_NVML = json.loads((DATA / "h200x2-nvml.json").read_text())
KEY = NodeKind("NVIDIA H200", 2, "0123456789abcdef", (18, 18), "580.95.05", "2.28.9")
MIB = 1 << 20


def sweep(**speedups) -> Timings:
    """All-reduce timings from 64 KiB to 8 GiB for 2 ranks: NCCL's default at
    300 GB/s plus 10 us, and each candidate `label=f(size) -> speed-up`,
    three rounds with a 0.2 % spread."""
    sizes = [(64 << 10) << i for i in range(18)]
    noise = random.Random(7)

    def rounds(seconds: float) -> list[float]:
        return [seconds * (1 + noise.uniform(-0.002, 0.002)) for _ in range(3)]

    base = {s: 10e-6 + s / 300e9 for s in sizes}
    samples = {DEFAULT.label: {s: rounds(base[s]) for s in sizes}}
    for label, speedup in speedups.items():
        samples[label] = {s: rounds(base[s] / speedup(s)) for s in sizes}
    return Timings(2, 1, {"allreduce": sizes}, {"allreduce": samples})


def test_recorded_h200x2_table_chooses_32_ctas_for_all_sizes():
    """The issue's nccl-tests runs on a 2xH200 node: 32 CTAs win 2.5-4.7 %
    at every size, NCCL_ALGO=Tree a little less; one bound, no per-size rule."""
    timings = Timings.from_dict(json.loads(ISSUE_TABLE.read_text()), str(ISSUE_TABLE))
    tuning = choose(timings, KEY)
    assert tuning.bound == 32
    assert tuning.env == {"NCCL_MIN_CTAS": "32", "NCCL_MAX_CTAS": "32"}
    assert tuning.plugin_env == tuning.env
    assert tuning.rules == []  # Tree was measured under NCCL's own bound only
    assert [(r.size // MIB, r.choice.label, round(r.gain, 3)) for r in tuning.results] == [
        (256, "ctas=32", 1.047),
        (1024, "ctas=32", 1.048),
        (4096, "ctas=32", 1.025),
    ]


def test_per_size_rules_merge_neighbours_and_split_between_sizes():
    timings = sweep(**{
        "ctas=32": lambda s: 1.04 if s >= 16 * MIB else 1.0,
        "ctas=32 tree/ll": lambda s: 1.15 if s <= 256 << 10 else 0.4,
        "ctas=32 ring/simple ch=16": lambda s: 1.10 if MIB <= s <= 4 * MIB else 0.98,
    })  # fmt: skip
    tuning = choose(timings, KEY)
    assert tuning.bound == 32
    small = {"collective": "allreduce", "algorithm": "tree", "protocol": "ll", "channels": 0}
    mid = {"collective": "allreduce", "algorithm": "ring", "protocol": "simple", "channels": 16}
    assert tuning.rules == [
        {**small, "min_bytes": 64 << 10, "max_bytes": math.isqrt((256 << 10) * (512 << 10))},
        {**mid, "min_bytes": math.isqrt((512 << 10) * MIB) + 1,
         "max_bytes": math.isqrt(4 * MIB * 8 * MIB)},
    ]  # fmt: skip
    by_size = {r.size: r for r in tuning.results}
    assert by_size[512 << 10].choice == Candidate(32)  # nothing won: the bound alone
    assert by_size[8 << 30].choice == Candidate(32) and by_size[8 << 30].gain > 1.03
    # The plugin's own reader takes the table Python wrote, rule for rule.
    version, ranks, nodes, rules = _native.tuning_table_rules(tuning.to_json(), "t.json")
    assert (version, ranks, nodes) == ("2.28.9", 2, 1)
    assert rules == [(4, 65536, 370727, 0, 0, 0), (4, 741456, 5931641, 1, 2, 16)]


def test_a_bound_that_loses_anywhere_is_not_taken():
    timings = sweep(**{"ctas=32": lambda s: 1.08 if s >= 64 * MIB else 0.95})
    tuning = choose(timings, KEY)
    assert tuning.bound == 0 and tuning.env == {} and tuning.rules == []
    assert all(r.choice == DEFAULT and r.gain == 1.0 for r in tuning.results)


def test_whole_run_env_takes_a_forced_pair_only_when_it_never_loses():
    safe = sweep(**{"nccl tree/simple": lambda s: 1.05})
    assert choose(safe, KEY).env == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}
    losing = sweep(**{"nccl tree/simple": lambda s: 1.05 if s > MIB else 0.9})
    tuning = choose(losing, KEY)
    assert tuning.env == {}
    # ...but per size it still wins where it wins, through the plugin.
    assert tuning.rules[0]["min_bytes"] == math.isqrt(MIB * 2 * MIB) + 1


def noisy(gain: float, spread: float) -> Timings:
    """Default and one candidate, each with three samples spread ±spread."""
    size = 256 * MIB
    base = size / 300e9
    samples = {
        DEFAULT.label: {size: [base * (1 - spread), base, base * (1 + spread)]},
        "nccl ring/simple": {size: [base / gain * (1 - spread), base / gain,
                                    base / gain * (1 + spread)]},
    }  # fmt: skip
    return Timings(2, 1, {"allreduce": [size]}, {"allreduce": samples})


@pytest.mark.parametrize(("gain", "spread", "chosen"), [
    (1.03, 0.05, False),   # a 3 % gain inside ±5 % noise
    (1.005, 0.0, False),   # steady, but under the floor
    (1.08, 0.05, False),   # past the noise, but its repeats overlap the default's
    (1.15, 0.05, True),    # past the noise, every repeat faster
])  # fmt: skip
def test_a_gain_inside_the_noise_is_never_chosen(gain, spread, chosen):
    results = choose(noisy(gain, spread), KEY).results
    assert (results[0].choice != DEFAULT) is chosen


@settings(max_examples=200, deadline=None)
@given(spread=st.floats(0.0, 0.2), fraction=st.floats(0.0, 0.999), seed=st.integers(0, 2**16))
def test_property_gain_within_noise_never_wins(spread, fraction, seed):
    """Any candidate whose gain is inside max(noise, floor) stays unchosen,
    whatever the samples' order and spread."""
    rng = random.Random(seed)
    threshold = max(spread / 1.0, NOISE_FLOOR)
    gain = 1 + fraction * threshold * 0.99
    base = 1e-3
    samples = {
        DEFAULT.label: {1: rng.sample([base * (1 - spread), base, base * (1 + spread)], 3)},
        "ctas=16": {1: [base / gain] * 3},
        "nccl tree/ll": {1: [base / gain] * 3},
    }
    timings = Timings(2, 1, {"allreduce": [1]}, {"allreduce": samples})
    tuning = choose(timings, KEY)
    assert tuning.bound == 0 and tuning.rules == [] and tuning.env == {}


def test_recorded_noop_on_one_gpu_chooses_nothing():
    """Recorded on one H200: with one rank NCCL runs nothing, so all 54
    candidates timed the same no-op, scattered 14-52 us by the machine.
    Three lucky repeats made one look 1.77x faster than the default; the
    machine's pooled noise and the non-overlap of repeats reject them all."""
    path = DATA / "nccl-tuning/h200-1rank-noop.json"
    timings = Timings.from_dict(json.loads(path.read_text()), str(path))
    assert len({label for by in timings.samples.values() for label in by}) == 18
    tuning = choose(timings, KEY)
    assert tuning.bound == 0 and tuning.env == {} and tuning.rules == []
    assert {r.choice for r in tuning.results} == {DEFAULT}


def test_one_sample_is_not_evidence():
    size = 256 * MIB
    samples = {DEFAULT.label: {size: [1e-3, 1e-3]}, "nccl ring/simple": {size: [5e-4]}}
    timings = Timings(2, 1, {"allreduce": [size]}, {"allreduce": samples})
    assert choose(timings, KEY).rules == []
    samples["nccl ring/simple"][size].append(5e-4)
    assert len(choose(timings, KEY).rules) == 1


def test_cache_key_follows_nccl_topology_and_nvlinks(h200x2_tree):
    topology = scan(str(h200x2_tree), probe_bar0=False)
    nvml = read_nvml(FakeNvml(H200X2_NVML))
    key = node_kind(topology, nvml, "2.28.9")
    assert key.gpu_model == "NVIDIA H200" and key.gpu_count == 2
    assert key.nvlinks == (18, 18) and key.driver_version == H200X2_NVML["driver"]
    assert node_kind(scan(str(h200x2_tree), probe_bar0=False), nvml, "2.28.9") == key
    newer = node_kind(topology, nvml, "2.29.1")
    assert newer.id != key.id
    assert key.differences(newer) == ["nccl_version 2.28.9 -> 2.29.1"]
    fewer_links = json.loads(json.dumps(H200X2_NVML))
    fewer_links["gpus"][0]["nvlinks"] = fewer_links["gpus"][0]["nvlinks"][:17]
    assert node_kind(topology, read_nvml(FakeNvml(fewer_links)), "2.28.9").id != key.id


def test_topology_hash_changes_with_placement(h200x2_tree, eightgpu_tree):
    nvml = read_nvml(FakeNvml(H200X2_NVML))
    a = node_kind(scan(str(h200x2_tree), probe_bar0=False), nvml, "2.28.9")
    b = node_kind(scan(str(eightgpu_tree), probe_bar0=False), nvml, "2.28.9")
    assert a.topology != b.topology


def test_cache_round_trip_and_stale_tables(tmp_path):
    tuning = choose(sweep(**{"ctas=32": lambda s: 1.05}), KEY)
    tuning.seconds = 41.5
    path = store(tuning, tmp_path)
    assert path == tmp_path / f"{KEY.id}.json"
    again = cached(KEY, tmp_path)
    assert again is not None and again.to_dict() == tuning.to_dict()
    upgraded = NodeKind(**{**KEY.to_dict(), "nvlinks": KEY.nvlinks, "nccl_version": "2.29.1"})
    assert cached(upgraded, tmp_path) is None
    found, why = find(upgraded, tmp_path)
    assert found is None
    assert why == (
        "the cached NCCL tuning is stale: nccl_version 2.28.9 -> 2.29.1 (pyinit nccl --tune)"
    )
    found, why = find(KEY, tmp_path)
    assert found is not None and why == str(path)
    assert find(KEY, tmp_path / "none")[1].startswith("no NCCL tuning for this kind of node in")
    path.write_text("{ not json")
    assert cached(KEY, tmp_path) is None  # a broken cache file is measured again


def test_bad_tables_name_the_file(tmp_path):
    tuning = choose(sweep(**{"nccl tree/ll": lambda s: 1.2}), KEY)
    good = write_table(tmp_path / "t.json", tuning)
    assert read_table(good).rules == tuning.rules
    document = tuning.to_dict()
    document["rules"][0]["algorithm"] = "spiral"
    (tmp_path / "bad.json").write_text(json.dumps(document))
    with pytest.raises(InputError, match=r"bad\.json: unknown algorithm 'spiral'"):
        read_table(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": 7}')
    with pytest.raises(InputError, match=r"other\.json: table format 7"):
        read_table(tmp_path / "other.json")
    with pytest.raises(FileNotFoundError):
        read_table(tmp_path / "missing.json")
    with pytest.raises(InputError, match="not a candidate: 'ctas=x'"):
        Candidate.parse("ctas=x")


@pytest.mark.parametrize("gpus", [2, 1])
def test_a_run_says_why_no_tuning_is_used_where_tune_could_make_one(h200x2_tree, tmp_path, gpus):
    """--tune times collectives between a node's GPUs: on a node of one, a line
    advising it would be noise at every launch; the event log keeps why."""
    import io
    from types import SimpleNamespace

    from conftest import run_events

    from pyinit.run.launcher import _nccl_tuning
    from pyinit.runlog.events import EventLog

    recording = {**H200X2_NVML, "gpus": H200X2_NVML["gpus"][:gpus]}
    node = SimpleNamespace(topology=scan(str(h200x2_tree), probe_bar0=False),
                           nvml=read_nvml(FakeNvml(recording)))  # fmt: skip
    out = io.StringIO()
    env = {"POD_INIT_CACHE": str(tmp_path / "empty")}
    assert _nccl_tuning(node, env, EventLog(tmp_path / "run" / "events.jsonl"), out) == (None, "")
    [event] = run_events(tmp_path / "run")
    assert event["event"] == "nccl_tuning" and event["used"] is False and event["reason"]
    said = f"pyinit run: NCCL tuning not used: {event['reason']}\n"
    assert out.getvalue() == (said if gpus > 1 else "")


def test_tuning_goes_into_nccl_env_and_beside_the_files(h200x2_tree, tmp_path):
    tuning = choose(sweep(**{"ctas=32": lambda s: 1.05, "ctas=32 tree/ll": lambda s: 1.2
                             if s < MIB else 0.5}), KEY)  # fmt: skip
    config = configure(str(h200x2_tree), out_dir=str(tmp_path), tuning=tuning, environment={})
    config.write()
    env_file = (tmp_path / "nccl.env").read_text()
    assert "NCCL_MIN_CTAS=32\n" in env_file and "NCCL_MAX_CTAS=32\n" in env_file
    assert config.env["NCCL_MAX_CTAS"] == "32"
    assert read_table(tmp_path / "nccl-tuning.json").to_dict() == tuning.to_dict()
    # The environment's own value still wins, and says so.
    mine = configure(str(h200x2_tree), out_dir=str(tmp_path / "b"), tuning=tuning,
                     environment={"NCCL_MAX_CTAS": "8"})  # fmt: skip
    assert mine.env["NCCL_MAX_CTAS"] == "8"


def test_plugin_run_env_drops_whole_run_choices_the_plugin_makes_per_size(tmp_path):
    tuning = choose(sweep(**{"nccl tree/simple": lambda s: 1.05}), KEY)
    assert tuning.env == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}
    changes = plugin_run_env(tuning, tmp_path / "t.json", {})
    assert changes == {"NCCL_ALGO": None, "NCCL_PROTO": None,
                       "NCCL_TUNER_PLUGIN": str(plugin_path()),
                       TABLE_ENV: str(tmp_path / "t.json")}  # fmt: skip
    assert plugin_path().is_file()
    kept = plugin_run_env(tuning, tmp_path / "t.json", {"NCCL_ALGO": "Ring"})
    assert "NCCL_ALGO" not in kept  # the user's own setting stays


def test_plot_shows_the_gain(tmp_path):
    tuning = choose(sweep(**{"ctas=32": lambda s: 1.05}), KEY)
    assert plot_tuning(tuning, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 10_000


def test_tuning_text_names_choices_and_env():
    tuning = choose(sweep(**{"ctas=32": lambda s: 1.05}), KEY)
    text = tuning.to_text()
    assert text.startswith("NCCL tuning for 2x NVIDIA H200, NCCL 2.28.9, driver 580.95.05")
    assert re.search(r"\n  allreduce +8G   1\.05\d   0\.020  ctas=32\n", text)
    assert "env for all sizes (nccl.env): NCCL_MAX_CTAS=32 NCCL_MIN_CTAS=32" in text


def test_tune_refuses_a_node_without_two_gpus(h200x2_tree, tmp_path):
    from pyinit.nccl import tune

    one = json.loads(json.dumps(H200X2_NVML))
    one["gpus"] = one["gpus"][:1]
    topology = scan(str(h200x2_tree), probe_bar0=False)
    with pytest.raises(InputError, match="this node has 1"):
        tune(topology, read_nvml(FakeNvml(one)), cache=tmp_path)


def test_cli_tune_without_nvml_is_a_usage_error(pyinit_bin, h200x2_tree, tmp_path):
    from conftest import run

    result = run([pyinit_bin, "nccl", "--tune", "--no-nvml", "--sysfs-root", str(h200x2_tree),
                  "--out", str(tmp_path)], env={**os.environ})  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "pyinit: --tune measures NCCL on this node's GPUs: it needs NVML, not --no-nvml"
    ]
    result = run([pyinit_bin, "nccl", "--tune", "--nvml-replay", str(tmp_path / "none.json"),
                  "--sysfs-root", str(h200x2_tree), "--out", str(tmp_path)])  # fmt: skip
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "none.json" in result.stderr


@pytest.mark.slow
def test_tune_where_the_ranks_cannot_run_is_one_line(pyinit_bin, h200x2_tree, tmp_path):
    """Two GPUs by (recorded) NVML, none for torch here: the measuring ranks
    start under torchrun, fail, and the command says why in one line."""
    from conftest import run

    result = run([pyinit_bin, "nccl", "--tune", "--nvml-replay", str(DATA / "h200x2-nvml.json"),
                  "--sysfs-root", str(h200x2_tree), "--cache", str(tmp_path / "cache"),
                  "--out", str(tmp_path / "out")])  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyinit nccl: the measuring ranks failed")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_tune_uses_the_table_stored_for_this_node_kind(pyinit_bin, h200x2_tree, tmp_path):
    """A table stored for this kind of node is used, not measured again (here,
    where no GPU could measure); where NCCL's version is unknown (no pip
    package of it), the table for exactly this hardware."""
    from conftest import run

    from pyinit.nccl.tuning import installed_nccl_version

    topology = scan(str(h200x2_tree), probe_bar0=False)
    nvml = read_nvml(FakeNvml(H200X2_NVML))
    key = node_kind(topology, nvml, installed_nccl_version() or "2.28.9")
    path = store(choose(sweep(**{"ctas=32": lambda s: 1.05}), key), tmp_path / "cache")
    result = run([pyinit_bin, "nccl", "--tune", "--nvml-replay", str(DATA / "h200x2-nvml.json"),
                  "--sysfs-root", str(h200x2_tree), "--cache", str(tmp_path / "cache"),
                  "--out", str(tmp_path / "out")])  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"pyinit nccl: tuning from {path} (measured before on this kind of node" in (
        result.stderr)  # fmt: skip
    assert "NCCL_MAX_CTAS=32" in (tmp_path / "out" / "nccl.env").read_text()  # the table's


def test_bench_tuning_needs_gpus(pyinit_bin, tmp_path):
    from conftest import run

    table = write_table(tmp_path / "t.json", choose(sweep(**{"ctas=32": lambda s: 1.05}), KEY))
    result = run([pyinit_bin, "bench", "allreduce", "--tuning", str(table), "--out",
                  str(tmp_path)], env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "pyinit: --tuning compares NCCL's choices: it needs GPUs"
    )


def test_bench_prints_default_beside_tuned():
    from pyinit.bench.collectives import tuned_table, wrong_total

    def cell(busbw: float, wrong: int = 0) -> dict:
        return {"time": 1.0, "alg_bw": busbw, "bus_bw": busbw, "nwrong": wrong}

    rows = [{"size": s, "out_of_place": None,
             "in_place": {**cell(300.0), "tuned": cell(300.0 * g, w), "gain": g}}
            for s, g, w in ((64 << 20, 1.04, 0), (1 << 30, 1.05, 2))]  # fmt: skip
    document = {"collective": "all_reduce", "ranks": 2, "results": rows,
                "tuning": {"table": "t.json", "key": "k", "bound": 32, "rounds": 5}}  # fmt: skip
    text = tuned_table(document)
    assert "    67108864      in-place    300.00    312.00   1.040       0" in text
    assert "  1073741824      in-place    300.00    315.00   1.050       2" in text
    assert "# Gain, lowest         : 1.040" in text
    assert wrong_total(rows) == 2 and "FAILED" in text


def test_channel_variants_are_tried_for_the_pair_that_wins_most_sizes():
    from pyinit.nccl.measure import _best_pair

    timings = sweep(**{
        "nccl tree/ll": lambda s: 1.2 if s <= 256 << 10 else 0.5,
        "nccl ring/simple": lambda s: 1.05 if s >= MIB else 0.9,
    })  # fmt: skip
    assert _best_pair(timings, "allreduce", 0) == Candidate(0, "ring", "simple")
    assert _best_pair(timings, "allreduce", 32) is None  # nothing forced under that bound


def test_a_table_with_sizes_that_wrap_or_values_that_inject_is_refused(h200x2_tree, tmp_path):
    """ranks 4294967298 once wrapped to 2 and was used for a 2-rank
    communicator; an env value with a newline added a line to nccl.env; a
    FIFO in the cache blocked --tune and pyinit run."""
    tuning = choose(sweep(**{"ctas=32": lambda s: 1.05}), KEY)
    for ranks in (4294967298, -4294967294):
        document = {**tuning.to_dict(), "ranks": ranks}
        (tmp_path / "wrapped.json").write_text(json.dumps(document))
        with pytest.raises(InputError, match=r"wrapped\.json: ranks must be from 1 to 16777216"):
            read_table(tmp_path / "wrapped.json")
    tuning.env = {"NCCL_MIN_CTAS": "32\nLD_PRELOAD=/tmp/evil.so"}
    with pytest.raises(InputError, match="the tuning table: NCCL_MIN_CTAS holds a newline"):
        configure(str(h200x2_tree), out_dir=str(tmp_path / "out"), tuning=tuning, environment={})
    assert not (tmp_path / "out").exists()
    os.mkfifo(tmp_path / f"{KEY.id}.json")
    with pytest.raises(InputError, match="not a regular file"):
        read_table(tmp_path / f"{KEY.id}.json")
    assert cached(KEY, tmp_path) is None  # measured again, never waited on
