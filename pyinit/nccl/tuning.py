"""NCCL tuning measured on the node in hand: what kind of node it is (the
cache key), the search from timing tables to choices, and the table that
NCCL's tuner plugin (``libpod_init_nccl_tuner.so``, built with the project)
reads.

The measuring itself (torch, GPUs) is ``pyinit.nccl.measure``; everything
here is plain data, so recorded timings give the same choices anywhere.

Two ways to apply a table:
- ``env``: one setting for all sizes (the best overall that never loses),
  written into ``nccl.env`` and usable by any launcher;
- the plugin: per collective and size range an algorithm, protocol and
  channel count, over ``plugin_env`` (the communicator's channel bound, which
  a plugin cannot raise per call).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyinit.errors import InputError
from pyinit.jsonfile import load_json, read_input_text, write_text

TABLE_FORMAT = 1
TABLE_NAME = "nccl-tuning.json"
PLUGIN_NAME = "libpod_init_nccl_tuner.so"
TABLE_ENV = "POD_INIT_NCCL_TUNING"  # where the plugin finds the table

# The collectives training uses, in NCCL's names as the table spells them.
COLLECTIVES = ("allreduce", "reducescatter", "allgather")
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
# NCCL_ALGO / NCCL_PROTO spell them so.
_ENV_ALGORITHM = {"tree": "Tree", "ring": "Ring", "pat": "PAT"}
_ENV_PROTOCOL = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}

# Gains smaller than this are not worth a rule even when the timings are
# steady: on an H200 node, identical work timed in turns differed by up to
# 1.2 % (tests/data/nccl-tuning/h200-1rank-noop.json).
NOISE_FLOOR = 0.02
# The sizes whose mean gain ranks whole-run settings: gradient buckets and up.
LARGE_BYTES = 64 << 20


def plugin_path() -> Path:
    """The tuner plugin installed beside the native module."""
    from pyinit import _native

    return Path(_native.__file__).with_name(PLUGIN_NAME)


@dataclass(frozen=True)
class NodeKind:
    """What a table is valid for: the same kind of node with the same NCCL
    measures the same; anything else is measured again."""

    gpu_model: str
    gpu_count: int
    topology: str  # hash of the GPUs' and NICs' PCIe placement (see topology_hash)
    nvlinks: tuple[int, ...]  # active NVLinks per GPU
    driver_version: str
    nccl_version: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_model": self.gpu_model,
            "gpu_count": self.gpu_count,
            "topology": self.topology,
            "nvlinks": list(self.nvlinks),
            "driver_version": self.driver_version,
            "nccl_version": self.nccl_version,
        }

    @property
    def id(self) -> str:
        """The cache file's name: a hash of every field."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def differences(self, other: NodeKind) -> list[str]:
        """'nccl_version 2.28.9 -> 2.29.1' for each field that differs."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{k} {mine[k]} -> {theirs[k]}" for k in mine if mine[k] != theirs[k]]


def topology_hash(topology: Any) -> str:
    """The placement that decides NCCL's paths: each GPU's and NIC's address,
    NUMA node, the bridges above it and its link's capability, and the PCIe
    level between every pair. Current link speed and anything that changes
    at run time stay out, so a downtrained link does not void the cache (the
    preflight reports those)."""
    placed = [
        {
            "bdf": d.bdf,
            "kind": d.kind,
            "numa": d.numa_node,
            "upstream": list(d.upstream),
            "link": [d.link.max_generation, d.link.max_width] if d.link else None,
        }
        for d in topology.devices
        if d.kind in ("gpu", "nic")
    ]
    levels = [list(row) for row in topology.matrix.rows]
    canonical = json.dumps({"devices": placed, "levels": levels}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def node_kind(topology: Any, nvml: Any, nccl_version: str) -> NodeKind:
    """The key from a scan and NVML's view (``pyinit.nvml.NvmlView``)."""
    gpus = nvml.gpus
    models = sorted({g.name for g in gpus})
    return NodeKind(
        gpu_model=",".join(models),
        gpu_count=len(gpus),
        topology=topology_hash(topology),
        nvlinks=tuple(len(g.nvlinks) for g in gpus),
        driver_version=nvml.driver,
        nccl_version=nccl_version,
    )


@dataclass(frozen=True)
class Candidate:
    """One way to run the collectives. ``ctas`` bounds the communicator
    (NCCL_MIN_CTAS = NCCL_MAX_CTAS; 0: NCCL's); the rest is per call,
    through the plugin (None / 0: NCCL's choice)."""

    ctas: int = 0
    algorithm: str | None = None
    protocol: str | None = None
    channels: int = 0

    @property
    def label(self) -> str:
        parts = [f"ctas={self.ctas}" if self.ctas else "nccl"]
        if self.algorithm:
            parts.append(f"{self.algorithm}/{self.protocol}")
        if self.channels:
            parts.append(f"ch={self.channels}")
        return " ".join(parts)

    @classmethod
    def parse(cls, label: str) -> Candidate:
        """The inverse of ``label``; ValueError naming the label otherwise."""
        ctas, algorithm, protocol, channels = 0, None, None, 0
        words = label.split()
        try:
            head, rest = words[0], words[1:]
            if head != "nccl":
                key, _, value = head.partition("=")
                if key != "ctas":
                    raise ValueError
                ctas = int(value)
            for word in rest:
                if word.startswith("ch="):
                    channels = int(word[3:])
                else:
                    algorithm, protocol = word.split("/")
                    if algorithm not in ALGORITHMS or protocol not in PROTOCOLS:
                        raise ValueError
        except (ValueError, IndexError):
            raise InputError(f"not a candidate: {label!r}") from None
        return cls(ctas, algorithm, protocol, channels)

    @property
    def per_call(self) -> bool:
        return self.algorithm is not None or self.channels > 0

    def bound_env(self) -> dict[str, str]:
        """The communicator bound as environment (what pg_options set in the measurement)."""
        if not self.ctas:
            return {}
        return {"NCCL_MIN_CTAS": str(self.ctas), "NCCL_MAX_CTAS": str(self.ctas)}


DEFAULT = Candidate()


@dataclass
class Timings:
    """Seconds per call, one sample per round, per collective, candidate and
    size: what ``pyinit.nccl.measure`` records (and tests replay).

    ``baseline`` holds, per candidate, NCCL's default as timed in the same
    rounds as that candidate: a machine drifts (clocks, caches, neighbours)
    between stages of a search, and only samples taken in turns compare.
    Without it (a table from other tools) the default's own samples serve."""

    ranks: int
    nodes: int
    sizes: dict[str, list[int]]  # collective -> sizes in bytes (NCCL's nBytes)
    samples: dict[str, dict[str, dict[int, list[float]]]]  # collective -> label -> size -> s
    baseline: dict[str, dict[str, dict[int, list[float]]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def table(by_collective: dict[str, dict[str, dict[int, list[float]]]]) -> dict:
            return {
                c: {label: {str(s): v for s, v in per.items()} for label, per in by.items()}
                for c, by in by_collective.items()
            }

        return {"ranks": self.ranks, "nodes": self.nodes, "sizes": self.sizes,
                "samples": table(self.samples), "baseline": table(self.baseline)}  # fmt: skip

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], source: str = "") -> Timings:
        def table(by_collective: Mapping[str, Any]) -> dict[str, dict[str, dict[int, list[float]]]]:
            return {
                c: {
                    Candidate.parse(label).label: {
                        int(s): [float(x) for x in v] for s, v in per.items()
                    }
                    for label, per in by.items()
                }
                for c, by in by_collective.items()
            }

        try:
            sizes = {c: [int(s) for s in v] for c, v in raw["sizes"].items()}
            timings = cls(int(raw["ranks"]), int(raw["nodes"]), sizes, table(raw["samples"]),
                          table(raw.get("baseline", {})))  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InputError(f"not a timing table ({e})", file=source) from None
        for collective in timings.samples:
            if collective not in COLLECTIVES:
                raise InputError(f"unknown collective {collective!r}", file=source)
            if DEFAULT.label not in timings.samples[collective]:
                raise InputError(f"{collective}: no timings of NCCL's default", file=source)
        return timings

    def median(self, collective: str, candidate: Candidate, size: int) -> float | None:
        values = self.samples[collective].get(candidate.label, {}).get(size)
        return statistics.median(values) if values else None

    def reference(self, collective: str, candidate: Candidate, size: int) -> list[float]:
        """NCCL's default as timed in turns with `candidate` at `size`; none
        where the candidate was paired but not at this size (its stage ran out
        of time there): samples from another stage do not compare."""
        paired = self.baseline.get(collective, {}).get(candidate.label)
        if paired is not None:
            return paired.get(size) or []
        return self.samples[collective][DEFAULT.label].get(size) or []

    def pooled_noise(self, collective: str, size: int) -> float:
        """The machine's noise at one size: the median of every candidate's."""
        spreads = [
            self.noise(collective, Candidate.parse(label), size)
            for label, per in self.samples[collective].items()
            if len(per.get(size) or []) >= 2
        ]
        return statistics.median(spreads) if spreads else 0.0

    def noise(self, collective: str, candidate: Candidate, size: int) -> float:
        return spread(self.samples[collective].get(candidate.label, {}).get(size) or [])


def spread(values: list[float]) -> float:
    """Half the relative spread of the repeats: how far one median may be
    off. One sample says nothing about its noise: then nothing can pass it."""
    if len(values) < 2:
        return math.inf
    return (max(values) - min(values)) / (2 * statistics.median(values))


@dataclass(frozen=True)
class SizeResult:
    collective: str
    size: int
    choice: Candidate  # DEFAULT where nothing won
    gain: float  # default time / chosen time (1.0 for the default)
    threshold: float  # the gain a candidate had to pass here
    default_seconds: float


@dataclass
class Tuning:
    """The search's result: per-size choices, the whole-run settings and the
    table the plugin reads."""

    key: NodeKind
    ranks: int
    nodes: int
    bound: int  # the communicator's CTAs the rules assume; 0 NCCL's
    env: dict[str, str]  # one setting for all sizes (nccl.env)
    results: list[SizeResult] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0  # how long the measurement took

    @property
    def plugin_env(self) -> dict[str, str]:
        return Candidate(self.bound).bound_env()

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TABLE_FORMAT,
            "kind": "pod-init NCCL tuning table",
            "key": self.key.to_dict(),
            "key_id": self.key.id,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "seconds": round(self.seconds, 3),
            "env": self.env,
            "plugin_env": self.plugin_env,
            "rules": self.rules,
            "sizes": [
                {
                    "collective": r.collective,
                    "bytes": r.size,
                    "choice": r.choice.label,
                    "gain": round(r.gain, 4),
                    "threshold": round(r.threshold, 4),
                    "default_us": round(r.default_seconds * 1e6, 3),
                }
                for r in self.results
            ],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], source: str) -> Tuning:
        try:
            if raw["format"] != TABLE_FORMAT:
                raise InputError(f"table format {raw['format']}, this pod-init reads "
                                 f"{TABLE_FORMAT}", file=source)  # fmt: skip
            key = raw["key"]
            kind = NodeKind(str(key["gpu_model"]), int(key["gpu_count"]), str(key["topology"]),
                            tuple(int(n) for n in key["nvlinks"]), str(key["driver_version"]),
                            str(key["nccl_version"]))  # fmt: skip
            env = {str(k): str(v) for k, v in raw["env"].items()}
            bound = int(raw["plugin_env"].get("NCCL_MAX_CTAS", 0))
            results = [
                SizeResult(r["collective"], int(r["bytes"]), Candidate.parse(r["choice"]),
                           float(r["gain"]), float(r["threshold"]), float(r["default_us"]) / 1e6)
                for r in raw["sizes"]
            ]  # fmt: skip
            return cls(kind, int(raw["ranks"]), int(raw["nodes"]), bound, env, results,
                       list(raw["rules"]), float(raw.get("seconds", 0.0)))  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, InputError):
                raise
            raise InputError(f"not a pod-init tuning table ({e!r})", file=source) from None

    def to_text(self) -> str:
        lines = [f"NCCL tuning for {self.key.gpu_count}x {self.key.gpu_model}, NCCL "
                 f"{self.key.nccl_version}, driver {self.key.driver_version} "
                 f"(key {self.key.id}, measured in {self.seconds:.1f} s)"]  # fmt: skip
        lines.append(f"  {'collective':<14}{'size':>10}  {'gain':>6}  {'noise':>6}  choice")
        for r in self.results:
            lines.append(f"  {r.collective:<14}{_human(r.size):>10}  {r.gain:6.3f}  "
                         f"{r.threshold:6.3f}  {r.choice.label}")  # fmt: skip
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items())) or "NCCL's defaults"
        lines.append(f"  env for all sizes (nccl.env): {env}")
        plugin = " ".join(f"{k}={v}" for k, v in sorted(self.plugin_env.items()))
        lines.append(f"  plugin: {len(self.rules)} rules" + (f" over {plugin}" if plugin else ""))
        return "\n".join(lines) + "\n"


def _human(size: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def measured_gain(
    t: Timings, collective: str, candidate: Candidate, size: int
) -> tuple[float, float]:
    """(gain over NCCL's default, the gain it must pass to count) at one size;
    gain 0 where the candidate was not measured there. The noise is the
    larger of the two sides' and of the machine's at that size (the median
    spread over all candidates): three lucky repeats of one candidate say
    little about a machine whose every candidate scatters."""
    reference = t.reference(collective, candidate, size)
    mine = t.median(collective, candidate, size)
    # Twice the machine's: a search makes hundreds of comparisons, and one
    # spread's worth of luck among them is no gain.
    sides = (spread(reference), t.noise(collective, candidate, size))
    threshold = max(NOISE_FLOOR, 2 * t.pooled_noise(collective, size), *sides)
    if not reference or mine is None or mine <= 0:
        return 0.0, threshold
    return statistics.median(reference) / mine, threshold


def _beats(t: Timings, collective: str, candidate: Candidate, size: int) -> float:
    """The candidate's gain where it surely beats the default at this size,
    else 0: its median gain passes the noise, and every repeat of it is
    faster than every repeat of the default."""
    gain, threshold = measured_gain(t, collective, candidate, size)
    mine = t.samples[collective].get(candidate.label, {}).get(size) or []
    base = t.reference(collective, candidate, size)
    if gain > 1 + threshold and mine and base and max(mine) < min(base):
        return gain
    return 0.0


def _safe(t: Timings, candidate: Candidate) -> bool:
    """Never slower than the default beyond the noise, at any measured size
    of any collective, and measured (repeatedly) at all of them."""
    for collective, sizes in t.sizes.items():
        for size in sizes:
            gain, threshold = measured_gain(t, collective, candidate, size)
            if gain < 1 - threshold or math.isinf(threshold):
                return False
    return True


def _overall(t: Timings, candidate: Candidate) -> float:
    """Geometric mean gain over the large sizes (all sizes where none is
    large), less the largest noise among them: what it surely gains."""
    gains, thresholds = [], []
    for collective, sizes in t.sizes.items():
        for size in [s for s in sizes if s >= LARGE_BYTES] or sizes:
            gain, threshold = measured_gain(t, collective, candidate, size)
            gains.append(gain)
            thresholds.append(threshold)
    if not gains or min(gains) <= 0:
        return 0.0
    return math.exp(sum(math.log(g) for g in gains) / len(gains)) - max(thresholds)


def _candidates(t: Timings) -> list[Candidate]:
    labels = {label for by in t.samples.values() for label in by}
    return sorted((Candidate.parse(label) for label in labels), key=lambda c: c.label)


def choose_bound(t: Timings) -> int:
    """The communicator's CTA bound: the unforced bound with the best overall
    gain (past the noise) among those that never lose; 0 (NCCL's) when none
    gains. One bound serves every size, so it must be safe at all."""
    best, best_gain = 0, 1.0
    for c in _candidates(t):
        if c.ctas and not c.per_call and _safe(t, c):
            gain = _overall(t, c)
            if gain > best_gain:
                best, best_gain = c.ctas, gain
    return best


def choose(t: Timings, key: NodeKind) -> Tuning:
    """Choices from timings. Per size, the candidate under the chosen bound
    with the largest gain, if it surely beats the default there (see
    _beats); elsewhere the bound alone (safe by construction) or NCCL's
    default. Sizes between two measured ones take the nearer (geometrically)."""
    bound = choose_bound(t)
    under_bound = [c for c in _candidates(t) if c.ctas == bound and c != DEFAULT]
    results: list[SizeResult] = []
    rules: list[dict[str, Any]] = []
    for collective in COLLECTIVES:
        sizes = sorted(t.sizes.get(collective, []))
        for i, size in enumerate(sizes):
            choice, gain, threshold = Candidate(bound), 1.0, NOISE_FLOOR
            if bound:
                gain, threshold = measured_gain(t, collective, choice, size)
            best = (gain, choice, threshold)
            for c in under_bound:
                g = _beats(t, collective, c, size)
                if g > best[0]:
                    best = (g, c, measured_gain(t, collective, c, size)[1])
            gain, choice, threshold = best
            base = t.median(collective, DEFAULT, size) or 0.0
            results.append(SizeResult(collective, size, choice, gain, threshold, base))
            if choice.per_call:
                low = size if i == 0 else math.isqrt(sizes[i - 1] * size) + 1
                high = size if i == len(sizes) - 1 else math.isqrt(size * sizes[i + 1])
                _add_rule(rules, collective, low, high, choice)
    env = _whole_run_env(t, bound)
    return Tuning(key, t.ranks, t.nodes, bound, env, results, rules)


def _add_rule(rules: list[dict[str, Any]], collective: str, low: int, high: int,
              choice: Candidate) -> None:  # fmt: skip
    rule = {"collective": collective, "min_bytes": low, "max_bytes": high,
            "algorithm": choice.algorithm, "protocol": choice.protocol,
            "channels": choice.channels}  # fmt: skip
    last = rules[-1] if rules else None
    same = ("collective", "algorithm", "protocol", "channels")
    if last and all(last[k] == rule[k] for k in same) and last["max_bytes"] + 1 == low:
        last["max_bytes"] = high  # neighbours with one choice: one range
    else:
        rules.append(rule)


def _whole_run_env(t: Timings, bound: int) -> dict[str, str]:
    """One setting for all sizes: the bound, plus NCCL_ALGO/NCCL_PROTO when a
    forced pair (NCCL's channels) under it is safe everywhere and better
    overall than the bound alone."""
    env = Candidate(bound).bound_env()
    base = _overall(t, Candidate(bound)) if bound else 1.0
    best, best_gain = None, max(base, 1.0)
    for c in _candidates(t):
        if c.ctas != bound or c.algorithm not in _ENV_ALGORITHM or c.channels:
            continue
        if _safe(t, c) and _overall(t, c) > best_gain:
            best, best_gain = c, _overall(t, c)
    if best is not None:
        env["NCCL_ALGO"] = _ENV_ALGORITHM[str(best.algorithm)]
        env["NCCL_PROTO"] = _ENV_PROTOCOL[str(best.protocol)]
    return env


def read_table(path: str | os.PathLike[str]) -> Tuning:
    """A table file; ``InputError`` naming it when it is not one (or its
    rules are not what the plugin would take), ``OSError`` when it cannot be
    read."""
    from pyinit import _native

    text = read_input_text(path)
    tuning = Tuning.from_dict(load_json(text, str(path)), str(path))
    _native.tuning_table_rules(text, str(path))  # the plugin's own reader
    return tuning


def write_table(path: str | os.PathLike[str], tuning: Tuning) -> Path:
    return write_text(path, tuning.to_json())


def plugin_run_env(
    tuning: Tuning, table: Path, environ: Mapping[str, str]
) -> dict[str, str | None]:
    """What a run changes in its environment to use the tuning through the
    plugin (None: unset). The whole-run NCCL_ALGO/NCCL_PROTO would hide the
    plugin's per-size choices, so they go, unless the user set them."""
    changes: dict[str, str | None] = {k: None for k in tuning.env if k not in environ}
    for key, value in tuning.plugin_env.items():
        changes[key] = environ.get(key, value)
    changes["NCCL_TUNER_PLUGIN"] = str(plugin_path())
    changes[TABLE_ENV] = str(table)
    return changes


def installed_nccl_version() -> str | None:
    """The NCCL torch loads, from its pip package's version (reading it
    from NCCL itself would mean loading torch or CUDA here); None when NCCL
    did not come from one."""
    from importlib import metadata

    for cuda in ("13", "12", "11"):
        try:
            return metadata.version(f"nvidia-nccl-cu{cuda}")
        except metadata.PackageNotFoundError:
            continue
    return None


def plot_tuning(tuning: Tuning, path: Path) -> bool:
    """Gain over NCCL's default per size, one line per collective, with the
    noise each gain had to pass; False without matplotlib."""
    from pyinit.plotting import bytes_axis, pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for collective in COLLECTIVES:
        rows = [r for r in tuning.results if r.collective == collective]
        if not rows:
            continue
        sizes = [r.size for r in rows]
        line = ax.plot(sizes, [r.gain for r in rows], marker="o", label=collective)[0]
        ax.fill_between(sizes, [1 - r.threshold for r in rows], [1 + r.threshold for r in rows],
                        color=line.get_color(), alpha=0.12)  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=0.8)
    bytes_axis(ax)
    ax.set_xlabel("message size (NCCL's bytes per call)")
    ax.set_ylabel("busbw gain over NCCL's default")
    key = tuning.key
    ax.set_title(f"NCCL tuning, {key.gpu_count}x {key.gpu_model}, NCCL {key.nccl_version}\n"
                 "shaded: the noise a choice had to pass")  # fmt: skip
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, path)
