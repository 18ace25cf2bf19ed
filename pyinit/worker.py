"""What a training script may tell ``pyinit run`` from inside a worker. All
of it is optional: under ``pyinit run`` every optimizer step already counts as
progress, without the script's help.

    import pyinit.worker
    for batch in loader:
        ...
        pyinit.worker.step()   # a loop without a torch optimizer, or a long step's parts
    with pyinit.worker.phase("checkpoint"):   # counted apart in pyinit report
        torch.save(model.state_dict(), path)

Outside ``pyinit run`` these do nothing (``phase`` just runs its block).
"""

from __future__ import annotations

from pyinit.phases import phase
from pyinit.runlog.progress import current

__all__ = ["phase", "step"]


def step() -> None:
    """Marks progress: the stall watch (``pyinit run --stall-timeout``) counts
    from the last step, or from the last call of this."""
    writer = current()
    if writer is not None:
        writer.step()
