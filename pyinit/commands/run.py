"""``pyinit run``: preflight, NCCL files, then torchrun on this node."""

from __future__ import annotations

import argparse
import errno
import os

from pyinit.run import config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    try:
        os.getcwd()  # the script, the run folder and torch's own files are found from here
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "the working folder was removed after this shell "
                                "entered it: cd to a folder that exists",
                                os.environ.get("PWD") or ".") from None  # fmt: skip
    from pyinit.run.launcher import run

    return run(config.config_from_args(args), args.nvml_backend)
