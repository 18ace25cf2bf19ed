"""pod-init: node runtime for GPU training machines."""

import importlib

__all__ = [
    "Acs",
    "Bar",
    "Bar0",
    "Device",
    "DirectReader",
    "Finding",
    "Link",
    "Matrix",
    "NvmlUnavailable",
    "NvmlView",
    "TokenShardDataset",
    "Topology",
    "__version__",
    "aligned_empty",
    "configure_nccl",
    "read_nvml",
    "scan",
]

# Every name is loaded on first use (PEP 562): the native module, numpy and
# torch cost tens of milliseconds each, and `import pyinit` should cost none
# of them until they are needed.
_LAZY = {
    **dict.fromkeys(
        ("Acs", "Bar", "Bar0", "Device", "Link", "Matrix", "Topology", "scan"), "pyinit.topology"
    ),
    "Finding": "pyinit.finding",
    **dict.fromkeys(("NvmlUnavailable", "NvmlView", "read_nvml"), "pyinit.nvml"),
    "DirectReader": "pyinit.io",
    "aligned_empty": "pyinit.io",
    "TokenShardDataset": "pyinit.data",
    "__version__": "pyinit._native",
}
_RENAMED = {"configure_nccl": ("pyinit.nccl", "configure")}


def __getattr__(name: str):
    if name == "_native":
        # `from pyinit import _native` asks here before it imports the submodule.
        try:
            return importlib.import_module("pyinit._native")
        except ModuleNotFoundError as e:
            if e.name != "pyinit._native":
                raise
            # No compiled module beside this file: a source tree (a checkout on
            # sys.path), not an installed package.
            raise ImportError(
                f"pyinit._native is not built in {__path__[0]}: this is pod-init's source tree; "
                "install it (pip install .) and run from outside the checkout, or build it in "
                "place (pip install --no-build-isolation -e .)"
            ) from None
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _RENAMED:
        module, attribute = _RENAMED[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'pyinit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
