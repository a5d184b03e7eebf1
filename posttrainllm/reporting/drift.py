"""How far training moved each depth of the model: the per-block drift report.

For every depth d (embeddings, block_0 … block_{N-1}, head, as in the LLRD plan):

    drift(d) = ‖W_after − W_before‖ / ‖W_before‖

with both norms taken over all of the depth's tensors together (the Frobenius norm of their concatenation), so a
depth with one changed matrix among ten frozen ones drifts less than one whose every matrix changed. Frozen
tensors count in the denominator and add nothing to the numerator. Under LoRA the change of an adapted weight is
the merged update B·A·scale (PEFT's ``get_delta_weight``), relative to the base weight.

No second copy of the model is held: the weights before training are read tensor by tensor from the
``--model`` safetensors files (``safe_open``); only trainable tensors that those files do not hold under the same
name (e.g. a tokenizer-resized embedding, a converted layout) are copied to CPU before training.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_ADAPTER_PARTS = re.compile(r"\.(?:base_layer|modules_to_save\.[^.]+|original_module)(?=\.)")


def _checkpoint_key(name: str) -> str:
    """The key a parameter has in the base model's checkpoint: wrappers, PEFT's base_layer/modules_to_save gone."""
    from posttrainllm.llrd import strip_wrappers

    return _ADAPTER_PARTS.sub("", strip_wrappers(name))


def _weight_files(model_ref: str) -> list[Path]:
    """The safetensors files of a local model directory, or of a hub model already in the local cache."""
    p = Path(model_ref).expanduser()
    if p.is_dir():
        return sorted(p.glob("*.safetensors"))
    try:  # a hub id: the files from_pretrained just used are in the cache
        from huggingface_hub import try_to_load_from_cache

        index = try_to_load_from_cache(model_ref, "model.safetensors.index.json")
        if isinstance(index, str):
            shards = sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))
            found = [try_to_load_from_cache(model_ref, s) for s in shards]
            return [Path(f) for f in found if isinstance(f, str)]
        single = try_to_load_from_cache(model_ref, "model.safetensors")
        return [Path(single)] if isinstance(single, str) else []
    except Exception:  # noqa: BLE001 - no cache, no files: the CPU-copy fallback covers it
        return []


def _is_lora(name: str) -> bool:
    return ".lora_" in name


class Baseline:
    """The weights before training, for `measure`: where each trainable tensor is on disk, or a CPU copy of it."""

    def __init__(self, model, model_ref: str | None):
        from safetensors import safe_open

        self.key_file: dict[str, Path] = {}
        shapes: dict[str, tuple] = {}
        for f in _weight_files(model_ref) if model_ref else []:
            with safe_open(str(f), framework="pt", device="cpu") as h:
                for key in h.keys():  # noqa: SIM118 - safe_open handles have keys(), not iteration
                    if key not in self.key_file:
                        self.key_file[key] = f
                        shapes[key] = tuple(h.get_slice(key).get_shape())
        self.copies: dict[str, Any] = {}
        for name, p in model.named_parameters():
            if not p.requires_grad or _is_lora(name):
                continue
            if shapes.get(_checkpoint_key(name)) != tuple(p.shape):  # not on disk as it is in the model
                self.copies[name] = _full(p).detach().to("cpu", copy=True)
        self._handles: dict[Path, Any] = {}

    def before(self, name: str):
        """The tensor `name` had before training (read from disk now, or the copy)."""
        if name in self.copies:
            return self.copies[name]
        from safetensors import safe_open

        f = self.key_file[_checkpoint_key(name)]
        if f not in self._handles:
            self._handles[f] = safe_open(str(f), framework="pt", device="cpu")
        return self._handles[f].get_tensor(_checkpoint_key(name))

    @property
    def source(self) -> str:
        if not self.copies:
            return "the base model's safetensors files"
        if not self.key_file:
            return "a CPU copy of the trainable weights taken before training"
        return f"the base model's safetensors files ({len(self.copies)} tensors from a CPU copy)"


def _full(p):
    """The whole tensor of a parameter (FSDP2 shards it as a DTensor: gathered, on every rank)."""
    try:
        from torch.distributed.tensor import DTensor

        if isinstance(p, DTensor):
            return p.full_tensor()
    except ImportError:  # pragma: no cover
        pass
    return p


def measure(model, baseline: Baseline, plan) -> dict:
    """Per-depth drift of `model` (after training) against `baseline`, with the depths of `plan` (llrd.LLRDPlan).

    Returns {"definition", "source", "depths": [{"block", "drift", "changed_tensors", "tensors"}, ...]}, one entry
    per depth that holds a tensor (tied input/output embeddings count once, at the depth the plan trains them at).
    Under FSDP every rank must call it (sharded tensors are gathered)."""
    import torch

    from posttrainllm.llrd import strip_wrappers

    depth_by_name = {strip_wrappers(n): d for n, d in plan.param_depths.items()}
    rows = plan.rows
    num = [0.0] * len(rows)
    den = [0.0] * len(rows)
    changed = [0] * len(rows)
    tensors = [0] * len(rows)

    def depth_of(name: str) -> int:
        plain = strip_wrappers(name)
        if plain in depth_by_name:
            return depth_by_name[plain]
        return depth_by_name.get(_checkpoint_key(name), len(rows) - 1)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if _is_lora(name):
                continue
            d = min(depth_of(name), len(rows) - 1)
            after = _full(p).detach().float().cpu()
            tensors[d] += 1
            if p.requires_grad:
                before = baseline.before(name).float()
                num[d] += float(((after - before) ** 2).sum())
                den[d] += float((before**2).sum())
                changed[d] += 1
            else:
                den[d] += float((after**2).sum())
        for module_name, module in model.named_modules():  # LoRA: the merged update of each adapted weight
            get_delta = getattr(module, "get_delta_weight", None)
            adapters = getattr(module, "active_adapters", None)
            if not callable(get_delta) or not adapters or not hasattr(module, "get_base_layer"):
                continue
            base_weight = getattr(module.get_base_layer(), "weight", None)
            if base_weight is None:
                continue
            d = min(depth_of(f"{module_name}.base_layer.weight"), len(rows) - 1)
            for adapter in adapters:
                if adapter in getattr(module, "lora_A", {}) or adapter in getattr(module, "lora_embedding_A", {}):
                    delta = get_delta(adapter).detach().float().cpu()
                    num[d] += float((delta**2).sum())
                    changed[d] += 1
    depths = [
        {
            "block": r["block"],
            "drift": (num[i] / den[i]) ** 0.5 if den[i] > 0 else 0.0,
            "changed_tensors": changed[i],
            "tensors": tensors[i],
        }
        for i, r in enumerate(rows)
        if tensors[i]  # a depth that holds no tensor (tied embeddings trained as the head, no position table)
    ]
    return {
        "definition": "||W_after - W_before||_F / ||W_before||_F over all tensors of each "
        "depth (LoRA: merged B·A·scale)",
        "source": baseline.source,
        "depths": depths,
    }


def bar_chart(report: dict, width: int = 40) -> str:
    """One text bar per depth, scaled to the largest drift (for the end-of-run output)."""
    rows = report["depths"]
    top = max((r["drift"] for r in rows), default=0.0) or 1.0
    name_w = max(len(r["block"]) for r in rows)
    lines = []
    for r in rows:
        n = round(width * r["drift"] / top)
        lines.append(f"{r['block']:<{name_w}}  {'█' * n}{' ' * (width - n)}  {r['drift']:.3g}")
    return "\n".join(lines)


def plot(report: dict, path: Path, title: str = "") -> str | None:
    """drift.png (needs matplotlib: pip install 'posttrainllm[plot]'); returns a note when it cannot be drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "drift.png not written: matplotlib is not installed (pip install 'posttrainllm[plot]')"
    rows = report["depths"]
    fig, ax = plt.subplots(figsize=(max(5, 0.45 * len(rows) + 2), 3.5))
    ax.bar(range(len(rows)), [r["drift"] for r in rows], color="#4472c4")
    ax.set_xticks(range(len(rows)), [r["block"] for r in rows], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("‖ΔW‖ / ‖W‖")
    ax.set_title(title or "per-depth weight drift", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
