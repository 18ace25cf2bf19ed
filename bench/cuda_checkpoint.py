"""CUDA tensors through a background checkpoint and back: the snapshot holds
what the tensors were when save() was called, on the first and last GPU.

    python3 bench/cuda_checkpoint.py PATH
"""

from __future__ import annotations

import sys

import torch

from pyinit import checkpoint


def main() -> int:
    path = sys.argv[1]
    last = f"cuda:{torch.cuda.device_count() - 1}"
    state = {"w": torch.randn(1024, 1024, device="cuda:0"), "b": torch.ones(7, device=last)}
    expected = {name: tensor.clone() for name, tensor in state.items()}
    pending = checkpoint.save(state, path, background=True)
    state["w"].add_(1)  # after the snapshot: not in the file
    crc = pending.wait()
    back = checkpoint.load(path, device="cuda:0")
    equal = all(torch.equal(back[name].cpu(), expected[name].cpu()) for name in expected)
    print(f"CUDA tensors through a background checkpoint: crc {crc:08x}, equal {equal}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
