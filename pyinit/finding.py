"""What a scan or a probe found wrong or worth saying: the PCI scan's
findings, NVML's (``pyinit.health``) and the preflight's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyinit import _native


@dataclass(frozen=True)
class Finding:
    severity: str  # info, warning, error
    code: str
    device: str
    message: str


def scan_findings(native: _native.Topology) -> list[Finding]:
    """The core scan's findings, as the topology's view holds them."""
    return [Finding(**f) for f in json.loads(native.to_json())["findings"]]
