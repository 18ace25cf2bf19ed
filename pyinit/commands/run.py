"""``pyinit run``: preflight, NCCL files, then torchrun on this node."""

from __future__ import annotations

import argparse

from pyinit.run import config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from pyinit.run.launcher import run

    return run(config.config_from_args(args), args.nvml_backend)
