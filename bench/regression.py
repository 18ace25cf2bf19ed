"""This checkout against an earlier commit, side by side in one run: the
figures a restructuring must not make worse, each side measured in turns
(which goes first alternates by round) so a noisy minute hits both alike.

    python3 bench/regression.py --baseline REF [--rounds 10] [--out DIR]

REF is a commit, or a folder holding a commit's source (`git archive REF`
unpacked, for a machine without the repository's history). Both sides are
built as wheels from their sources (REF's, and this working tree) and
installed into two scratch venvs that reach this interpreter's site-packages
for torch and numpy. Measured:
  scan      `pod-init topo --json --no-bar0` of the 8-GPU fixture, wall ms
  import    `python -c "import pyinit"`, wall ms
  spawn     `pyinit run` from its start to torchrun's spawn event, ms (one CPU worker)
  reader    4 KiB random O_DIRECT reads at queue depth 1 through pyinit.io's
            DirectReader, reads per second (a 256 MiB file on /var/tmp)
"""

from __future__ import annotations

import argparse
import os
import shutil
import site as site_module
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from pyinit.jsonfile import write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import sysfs_fixtures  # noqa: E402
from run_startup import spawn_ms  # noqa: E402  (this folder, sys.path[0] of a script)

READER = """
import os, random, sys, time
from pyinit.io import DirectReader
reader = DirectReader(sys.argv[1], queue_depth=1)
blocks = os.path.getsize(sys.argv[1]) // 4096
rng = random.Random(7)
done, began = 0, time.perf_counter()
while time.perf_counter() - began < float(sys.argv[2]):
    reader.read(rng.randrange(blocks) * 4096, 4096)
    done += 1
print(done / (time.perf_counter() - began))
"""
# One node, no monitor: the launch alone, the same on both sides.
ALONE = ("--standalone", "--monitor-interval", "0")
# Higher is better only for the reader.
HIGHER_IS_BETTER = {"reader"}


def baseline_side(ref: str, folder: Path, source: Path | None) -> Path:
    """REF's sources (from git, unless given), built and installed (once, where
    --work keeps them)."""
    if (folder / "venv/bin/pod-init").exists():
        return folder / "venv/bin"
    if source is not None:
        return build_side(source, folder)
    source = folder / "source"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref], check=True,
                             capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", source], input=archive, check=True)
    return build_side(source, folder)


def build_side(source: Path, folder: Path) -> Path:
    """A fresh venv in `folder` with `source` installed; returns its bin folder."""
    shutil.rmtree(folder / "venv", ignore_errors=True)
    shutil.rmtree(folder / "wheels", ignore_errors=True)
    wheels = folder / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                    "-w", wheels, source], check=True)  # fmt: skip
    venv = folder / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", venv], check=True)  # type: ignore[attr-defined]
    site = next((venv / "lib").glob("python*/site-packages"))
    # torch, numpy and the rest from here; a path named in a .pth file runs none of
    # its own .pth files, so this checkout's editable install stays out.
    shared = dict.fromkeys([*site_module.getsitepackages(), sysconfig.get_paths()["purelib"]])
    (site / "_shared_dependencies.pth").write_text("".join(f"{p}\n" for p in shared))
    subprocess.run([venv / "bin/pip", "install", "-q", "--no-deps", *wheels.glob("*.whl")],
                   check=True)  # fmt: skip
    # Where this venv's scripts went: a distribution's patched scheme may put them
    # elsewhere than bin/ (venv/local/bin); measured beside its python all the same.
    where = [venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_path('scripts'))"]
    scripts = Path(subprocess.run(where, check=True, capture_output=True, text=True).stdout.strip())
    for name in ("pod-init", "pyinit"):
        if not (venv / "bin" / name).exists():
            if not (scripts / name).exists():
                raise SystemExit(f"regression: {name} was not installed in {venv}")
            (venv / "bin" / name).symlink_to(scripts / name)
    return venv / "bin"


def checked(command: list[str | Path], statuses: tuple[int, ...] = (0,)) -> str:
    """The command's stdout; SystemExit with its last lines when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, cwd="/")
    if done.returncode not in statuses:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"regression: {' '.join(map(str, command[:3]))}... exited "
                         f"{done.returncode}: {said}")  # fmt: skip
    return done.stdout


def timed_ms(command: list[str | Path], statuses: tuple[int, ...] = (0,)) -> float:
    began = time.perf_counter()
    checked(command, statuses)
    return (time.perf_counter() - began) * 1e3


def measure(bin_dir: Path, scratch: Path, round_no: int) -> dict[str, float]:
    script = scratch / "noop.py"
    run_dir = scratch / f"run-{bin_dir.parent.parent.name}-{round_no}"
    reads = checked([bin_dir / "python", "-c", READER, scratch / "data.bin", "1.0"])
    # The fixture's findings include errors (a degraded link): exit 1 is its verdict.
    return {
        "scan": timed_ms(
            [bin_dir / "pod-init", "topo", "--json", "--no-bar0", "--sysfs-root", scratch / "sys"],
            (0, 1),
        ),
        "import": timed_ms([bin_dir / "python", "-c", "import pyinit"]),
        "spawn": spawn_ms(bin_dir / "pyinit", script, run_dir, *ALONE),
        "reader": float(reads.strip()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, metavar="REF", help="the commit to compare")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=".", metavar="DIR", help="folder for regression.json")
    parser.add_argument("--work", metavar="DIR",
                        help="keep the builds here and reuse them (default: scratch)")  # fmt: skip
    args = parser.parse_args()
    source = Path(args.baseline) if Path(args.baseline).is_dir() else None
    if source is None:
        named = ["git", "-C", ROOT, "rev-parse", "--short", args.baseline]
        baseline = subprocess.run(named, check=True, capture_output=True, text=True).stdout.strip()
    else:
        baseline = source.resolve().name
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="pod-init-regression-") as tmp:
        builds, scratch = Path(args.work or tmp), Path(tmp)  # what is measured is made anew
        sides = {baseline: baseline_side(baseline, builds / f"baseline-{baseline}", source),
                 "this": build_side(ROOT, builds / "this")}  # fmt: skip
        sysfs_fixtures.build_8gpu(scratch / "sys")
        (scratch / "noop.py").write_text("pass\n")
        with open(scratch / "data.bin", "wb") as f:
            f.write(os.urandom(256 << 20))
        samples: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
        for round_no in range(args.rounds):
            order = list(sides) if round_no % 2 == 0 else list(sides)[::-1]
            for side in order:
                for name, value in measure(sides[side], scratch, round_no).items():
                    samples[side].setdefault(name, []).append(value)
            print(f"round {round_no} done", file=sys.stderr)
    medians = {side: {k: statistics.median(v) for k, v in s.items()} for side, s in samples.items()}
    print(f"{'figure':8} {baseline:>12} {'this':>12} {'this/base':>10}  (medians of {args.rounds})")
    for name in medians["this"]:
        old, new = medians[baseline][name], medians["this"][name]
        unit = "reads/s" if name in HIGHER_IS_BETTER else "ms"
        print(f"{name:8} {old:12.1f} {new:12.1f} {new / old:9.2f}x  {unit}")
    write_json(Path(args.out) / "regression.json",
               {"date": time.strftime("%Y-%m-%d"), "machine": os.uname().nodename,
                "baseline": baseline, "rounds": args.rounds, "medians": medians,
                "samples": samples})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
