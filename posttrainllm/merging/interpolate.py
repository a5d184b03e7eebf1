"""The merge itself, tensor by tensor: θ = θ_base + s · (θ_tuned − θ_base), streamed from two sources into
safetensors shards. Torch only."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from posttrainllm.merging.tensors import write_streamed


class TensorMismatch(ValueError):
    """The two models do not hold the same tensors (``what``: "names", "shapes" or "values"; ``name``: the first)."""

    def __init__(self, what: str, name: str, message: str):
        super().__init__(message)
        self.what, self.name = what, name


class NonFiniteTensor(ValueError):
    """A tensor holds NaN or an infinity: ``side`` is "base", "tuned" (an input) or "merged" (the result of finite
    inputs, an overflow); ``name`` the tensor."""

    def __init__(self, side: str, name: str):
        super().__init__(f"tensor {name} of the {side} model holds NaN or infinite values")
        self.side, self.name = side, name


_CHECK_ELEMENTS = 1 << 20  # elements of a piece checked at once: a boolean tensor of at most 1 MiB


def _finite(t: torch.Tensor, side: str, name: str) -> torch.Tensor:
    """`t` itself, after checking that a floating-point tensor holds no NaN or infinity (NonFiniteTensor), a slice
    of `_CHECK_ELEMENTS` at a time (the check adds no piece-sized tensor to a merge's memory)."""
    if not (t.is_floating_point() and t.numel()):
        return t
    flat = t.reshape(-1)
    for start in range(0, flat.numel(), _CHECK_ELEMENTS):
        part = flat[start : start + _CHECK_ELEMENTS]
        if not bool(torch.isfinite(part if part.element_size() > 1 else part.float()).all()):
            raise NonFiniteTensor(side, name)
    return t


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
    b = base.to(work)
    out = torch.sub(tuned.to(work), b)  # in place from here on: one new tensor, not four
    out.mul_(s)
    out.add_(b)
    return out.to(tuned.dtype)


def _row_blocks(shape: tuple[int, ...], element_bytes: int, piece_bytes: int) -> list[tuple[int, int] | None]:
    """Blocks of rows ``[a, b)`` of at most about `piece_bytes` each; [None] (the whole tensor) for a scalar."""
    if not shape or shape[0] == 0:
        return [None]
    row = max(1, element_bytes * (math.prod(shape) // shape[0]))
    step = max(1, piece_bytes // row)
    return [(a, min(a + step, shape[0])) for a in range(0, shape[0], step)]


def merge_streamed(
    base,
    tuned,
    scale_of: Callable[[str], float],
    out_dir: Path,
    *,
    max_shard_bytes: int = 2 << 30,
    piece_bytes: int = 16 << 20,
    on_tensor: Callable[[str], None] | None = None,
) -> list[str]:
    """Merge every tensor of `tuned` with the same-named one of `base` (sources: ``SafetensorsSource`` /
    ``StateDictSource``) at ``scale_of(name)`` and write the result into `out_dir` as safetensors shards, a block
    of at most about `piece_bytes` of one tensor's rows in memory at a time (with its two inputs; the result is
    elementwise, so the blocks give the same bits as the whole tensor). The output keeps the tuned model's names,
    order and dtypes. Returns the weight file names written. Call ``first_mismatch`` first: names and shapes must
    agree. Every piece read and every piece written is checked: a NaN or infinity raises ``NonFiniteTensor`` (the
    shard being written is then incomplete: the caller removes it)."""
    entries = [(name, *tuned.meta(name)) for name in tuned.names()]

    def produce(name: str):
        s = scale_of(name)
        dtype, shape = tuned.meta(name)
        for rows in _row_blocks(shape, torch.empty((), dtype=dtype).element_size(), piece_bytes):
            if s == 1.0:
                yield _finite(tuned.read(name, rows), "tuned", name)
            elif s == 0.0:
                yield _finite(base.read(name, rows), "base", name).to(dtype)
            else:
                b = _finite(base.read(name, rows), "base", name)
                t = _finite(tuned.read(name, rows), "tuned", name)
                yield _finite(interpolate(b, t, s, name), "merged", name)
        if on_tensor is not None:
            on_tensor(name)

    return write_streamed(Path(out_dir), entries, produce, max_shard_bytes)
