"""The merge itself, tensor by tensor: θ = θ_base + s · (θ_tuned − θ_base), streamed from two sources into
safetensors shards. Torch only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from posttrainllm.merging.tensors import write_streamed


class TensorMismatch(ValueError):
    """The two models do not hold the same tensors (``what``: "names", "shapes" or "values"; ``name``: the first)."""

    def __init__(self, what: str, name: str, message: str):
        super().__init__(message)
        self.what, self.name = what, name


def first_mismatch(base, tuned) -> TensorMismatch | None:
    """The first difference in tensor names or shapes between two sources (headers only), in name order, or None."""
    b_names, t_names = set(base.names()), set(tuned.names())
    for name in sorted(b_names | t_names):
        if name not in t_names:
            return TensorMismatch("names", name, f"tensor {name} is in the base but not in the tuned model")
        if name not in b_names:
            return TensorMismatch("names", name, f"tensor {name} is in the tuned model but not in the base")
        (_, bs), (_, ts) = base.meta(name), tuned.meta(name)
        if tuple(bs) != tuple(ts):
            return TensorMismatch("shapes", name, f"tensor {name} has shape {list(bs)} in the base, {list(ts)} tuned")
    return None


def interpolate(base: torch.Tensor, tuned: torch.Tensor, s: float, name: str = "") -> torch.Tensor:
    """θ_base + s · (θ_tuned − θ_base) in the tuned tensor's dtype, computed in float32 (float64 for float64 tensors).
    s = 1 returns the tuned tensor and s = 0 the base tensor unchanged (bit for bit, in the tuned dtype). Integer
    and boolean tensors cannot be interpolated: they must be equal (else a TensorMismatch) unless s is 0 or 1."""
    if s == 1.0:
        return tuned
    if s == 0.0:
        return base.to(tuned.dtype)
    if not tuned.is_floating_point():
        if not torch.equal(base, tuned.to(base.dtype)):
            raise TensorMismatch("values", name, f"tensor {name} ({tuned.dtype}) differs and cannot be interpolated")
        return tuned
    work = torch.float64 if tuned.dtype == torch.float64 else torch.float32
    b, t = base.to(work), tuned.to(work)
    return (b + s * (t - b)).to(tuned.dtype)


def merge_streamed(
    base,
    tuned,
    scale_of: Callable[[str], float],
    out_dir: Path,
    *,
    max_shard_bytes: int = 2 << 30,
    on_tensor: Callable[[str], None] | None = None,
) -> list[str]:
    """Merge every tensor of `tuned` with the same-named one of `base` (sources: ``SafetensorsSource`` /
    ``StateDictSource``) at ``scale_of(name)`` and write the result into `out_dir` as safetensors shards, one tensor
    in memory at a time (plus its two inputs). The output keeps the tuned model's names, order and dtypes.
    Returns the weight file names written. Call ``first_mismatch`` first: names and shapes must agree."""
    entries = [(name, *tuned.meta(name)) for name in tuned.names()]

    def produce(name: str) -> torch.Tensor:
        s = scale_of(name)
        if s == 1.0:
            out = tuned.read(name)
        elif s == 0.0:
            out = base.read(name).to(tuned.meta(name)[0])
        else:
            out = interpolate(base.read(name), tuned.read(name), s, name)
        if on_tensor is not None:
            on_tensor(name)
        return out

    return write_streamed(Path(out_dir), entries, produce, max_shard_bytes)
