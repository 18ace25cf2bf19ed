"""The training data path: the token shard format (``shard_format``), the
sharder behind ``pyinit shard`` (``sharder``), ``TokenShardDataset`` for torch
data loaders (``dataset``) and the loops both compile (``_kernels``; which
build runs: ``kernels``)."""

import importlib

__all__ = ["TokenShardDataset", "shard"]

# Loaded on first use: the dataset needs torch, the sharder does not.
_LAZY = {"TokenShardDataset": "pyinit.data.dataset", "shard": "pyinit.data.sharder"}


def __getattr__(name: str):
    if name == "TokenShardDataset":
        from pyinit.extras import require

        require("torch", "pyinit.data.TokenShardDataset")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pyinit.data' has no attribute {name!r}")
