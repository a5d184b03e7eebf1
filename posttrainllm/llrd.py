"""Layer-wise learning-rate decay (LLRD): one optimizer param group per depth of the network.

A model with N decoder blocks (its block list, e.g. ``model.layers``) is cut into N + 2 depths:

    depth 0      embeddings: token + learned position embeddings and everything before the block list
                 (ViT cls_token / patch embeddings, BERT embeddings LayerNorm, OPT project_in, ...)
    depth i + 1  block i (0 = closest to the input)
    depth N + 1  head: final norm, LM head and everything after the block list (OPT project_out, ...)

and every depth trains at ``base_lr * scale`` with

    scale(block i)    = gamma ** (N - 1 - i)        (top block: 1, block 0: gamma ** (N - 1))
    scale(embeddings) = gamma ** (N - 1)            (same as block 0)
    scale(head)       = 1
    scale             = max(scale, min_scale)       (clamp, as timm's ``layer_decay_min_scale``)

Worked example, N = 4, gamma = 0.5, base_lr = 1e-3: block_3 1e-3, block_2 5e-4, block_1 2.5e-4,
block_0 and embeddings 1.25e-4, head 1e-3.

The structure comes from the modules, never from which parameters happen to be trainable, so LoRA
adapters inside block i train at block i's LR. Wrapper prefixes (PEFT ``base_model.model.``, FSDP
``_fsdp_wrapped_module.``, activation checkpointing ``_checkpoint_wrapped_module.``, torch.compile
``_orig_mod.``, DDP ``module.``) are transparent. Torch only: the model is any ``nn.Module``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from .errors import ModelStructureError, UsageError

TIED_POLICIES = ("embedding", "head")  # what LR a tied input/output embedding matrix gets
DEFAULT_TIED_POLICY = "head"  # measured: bench/tied_policy.py, docs/decision_log.md entry 14

_WRAPPER_PARTS = {"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"}
# Known block-list paths (after stripping wrappers), most specific first; matched as a dotted suffix.
_BLOCK_SUFFIXES = ("model.layers", "model.language_model.layers", "language_model.layers", "transformer.h",
                   "gpt_neox.layers", "model.decoder.layers", "decoder.layers", "transformer.blocks",
                   "transformer.layers", "encoder.layer", "encoder.layers", "layers", "h", "blocks", "layer",
                   "block")
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# Weight decay exclusions, as transformers' Trainer.get_decay_parameter_names (matched on the lowercased name).
_NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")
# Non-block parameters registered "out of order" (OPT defines final_layer_norm/project_out before its layers).
_AFTER_HINT = re.compile(r"(?:^|\.)(?:final_layer_?norm|final_norm|norm_f|ln_f|project_out|lm_head|embed_out)(?:\.|$)")
_BEFORE_HINT = re.compile(r"(?:^|\.)(?:embed(?!_out)\w*|\w*embeddings?|wte|wpe|project_in|cls_token)(?:\.|$)")


@dataclass
class LLRDPlan:
    """The param groups plus what the run report needs. ``groups`` goes straight into the optimizer.

    ``rows`` has one entry per depth (embeddings, block_0 .. block_{N-1}, head), always all N + 2 of them:
    ``n_params``/``n_tensors`` count the trainable parameters plus those frozen by ``freeze_below``; a row
    whose parameters are all frozen by the user (e.g. embeddings under LoRA) has ``n_params == 0`` and
    ``trainable == False`` (``trainable`` = the row has parameters in the optimizer).
    """

    groups: list[dict]
    param_names: dict[str, list[str]]
    rows: list[dict]
    num_layers: int
    block_path: str | None
    base_lr: float
    gamma: float
    weight_decay: float
    tied: bool = False
    tied_policy: str = DEFAULT_TIED_POLICY
    tied_param_name: str | None = None
    tied_lr: float | None = None
    min_scale: float = 0.0
    freeze_below: float = 0.0
    frozen_param_names: list[str] = field(default_factory=list)
    frozen_state_bytes_saved: int = 0
    warnings: list[str] = field(default_factory=list)
    structure_found: bool = True

    def to_json(self) -> list[dict]:
        """Groups without tensors (``param_groups.json``)."""
        keys = ("name", "lr", "weight_decay", "scale", "depth")
        return [{**{k: g[k] for k in keys}, "params": list(self.param_names[g["name"]])} for g in self.groups]

    def lr_of(self, name: str) -> float:
        """LR of a group (by group name) or of a parameter (by its name in ``model.named_parameters()``)."""
        for g in self.groups:
            if name == g["name"] or name in self.param_names[g["name"]]:
                return g["lr"]
        stripped = _strip(name)
        for g in self.groups:
            if any(_strip(n) == stripped for n in self.param_names[g["name"]]):
                return g["lr"]
        raise KeyError(f"no group or trainable parameter named {name!r}")

    def summary_line(self) -> str:
        if not self.structure_found:
            return f"γ={self.gamma:g} (flat: block list not resolved) → all LR={format_lr(self.base_lr)}"
        low = self.base_lr * max(self.gamma ** (self.num_layers - 1), self.min_scale)
        text = f"γ={self.gamma:g} → block_0 LR={format_lr(low)}, head LR={format_lr(self.base_lr)}"
        if self.frozen_param_names:
            text += f", {len(self.frozen_param_names)} tensors frozen (scale < {self.freeze_below:g})"
        return text


def format_lr(x: float) -> str:
    """3 significant digits, trailing zeros dropped, e-notation below 1e-2 (e.g. 2.32e-06, 3e-05, 0.5): enough that
    the printed block_0/head ratio matches γ^(N-1) to better than 0.5%."""
    if x == 0 or abs(x) >= 1e-2:
        return f"{x:.3g}"
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"


def _strip(name: str) -> str:
    """Name without wrapper prefixes: ``base_model.model.model.layers.0._orig_mod.x`` → ``model.layers.0.x``."""
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    while True:
        if parts[:1] == ["module"]:
            parts = parts[1:]
        elif parts[:2] == ["base_model", "model"]:
            parts = parts[2:]
        else:
            return ".".join(parts)


def _config_num_layers(model: nn.Module) -> int | None:
    """Layer count from ``config`` on the model or on the first wrapped module that has one."""
    for module in model.modules():
        cfg = getattr(module, "config", None)
        if cfg is None:
            continue
        try:
            cfg = cfg.get_text_config()
        except Exception:
            pass
        for key in _LAYER_COUNT_KEYS:
            value = cfg.get(key) if isinstance(cfg, dict) else getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _list_candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m)]


def _first(items: list[str], k: int) -> str:
    return ", ".join(items[:k]) + (f", +{len(items) - k} more" if len(items) > k else "")


def _describe(cands) -> str:
    return _first([f"{n} ({len(m)})" for n, m in cands], 12)


def find_block_list(model: nn.Module, block_path: str | None = None) -> tuple[str, nn.ModuleList]:
    """Dotted path (as in ``model.named_modules()``, wrapper prefixes included) and the block ModuleList.

    Auto-detection: among ModuleLists (or Sequentials) whose length equals the config's layer count, take
    the first known path suffix (``model.layers``, ``transformer.h``, ...), else the one with most
    parameters. Without a config, only known suffixes are accepted. ``block_path`` names the list
    explicitly (exact ``named_modules()`` name, or a suffix of the wrapper-stripped name). Raises
    ``UsageError`` for a bad ``block_path`` and ``ModelStructureError`` when nothing fits.
    """
    cands = _list_candidates(model)
    if block_path:
        modules = dict(model.named_modules())
        want = _strip(block_path)
        hits = [n for n in modules if n == block_path] or [n for n in modules if _strip(n) == want] or \
               [n for n in modules if _strip(n).endswith("." + want)]
        if not hits or not isinstance(modules[hits[0]], (nn.ModuleList, nn.Sequential)) or not len(modules[hits[0]]):
            what = "no such module" if not hits else f"{type(modules[hits[0]]).__name__} is not a ModuleList of blocks"
            raise UsageError(f"--llrd-blocks {block_path!r}: {what}. "
                             f"ModuleLists in {type(model).__name__}: {_describe(cands) or 'none'}")
        return hits[0], modules[hits[0]]

    n_cfg = _config_num_layers(model)
    pool = [(n, m) for n, m in cands if n_cfg is None or len(m) == n_cfg]

    def rank(item):
        stripped = _strip(item[0])
        known = [i for i, s in enumerate(_BLOCK_SUFFIXES) if stripped == s or stripped.endswith("." + s)]
        return known[0] if known else len(_BLOCK_SUFFIXES), -sum(p.numel() for p in item[1].parameters())

    ranked = sorted(pool, key=rank)
    if ranked and (n_cfg is not None or rank(ranked[0])[0] < len(_BLOCK_SUFFIXES)):
        return ranked[0]

    names = [n for n, _ in model.named_parameters()]
    shown = _first(names, 8)
    wanted = f"N = {n_cfg} blocks (config.num_hidden_layers)" if n_cfg else "blocks (no layer count in a config)"
    example = cands[0][0] if cands else "model.layers"
    raise ModelStructureError(
        f"LLRD: no block list of {wanted} found in {type(model).__name__}. "
        f"Parameters not matched to any block ({len(names)}): {shown or 'none'}. "
        f"ModuleLists in the model: {_describe(cands) or 'none'}. "
        f"Fix: name the block list with --llrd-blocks PATH (recipe key `llrd_blocks`), e.g. --llrd-blocks {example}; "
        f"or use γ = 1 (no layer-wise decay).")


def _io_embeddings(model: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """``get_input_embeddings()`` / ``get_output_embeddings()`` of the first (possibly wrapped) module having them."""
    for module in model.modules():
        if callable(getattr(module, "get_input_embeddings", None)):
            found = []
            for getter in ("get_input_embeddings", "get_output_embeddings"):
                try:
                    mod = getattr(module, getter)()
                except Exception:
                    mod = None
                found.append(mod if isinstance(mod, nn.Module) else None)
            return found[0], found[1]
    return None, None


def _check_args(base_lr, gamma, weight_decay, tied_policy, min_scale, freeze_below) -> None:
    def ok(x, lo, hi):
        return isinstance(x, (int, float)) and math.isfinite(x) and lo <= x <= hi

    problems = []
    if not ok(gamma, 0.5, 1.0):
        problems.append(f"LLRD gamma must be in [0.5, 1.0], got {gamma!r}")
    if not ok(base_lr, 0.0, math.inf) or base_lr <= 0:
        problems.append(f"learning rate must be > 0 and finite, got {base_lr!r}")
    if not ok(weight_decay, 0.0, math.inf):
        problems.append(f"weight decay must be >= 0 and finite, got {weight_decay!r}")
    if not ok(min_scale, 0.0, 1.0):
        problems.append(f"LLRD min_scale must be in [0, 1], got {min_scale!r}")
    if not ok(freeze_below, 0.0, 1.0):
        problems.append(f"LLRD freeze_below must be in [0, 1], got {freeze_below!r}")
    if tied_policy not in TIED_POLICIES:
        problems.append(f"unknown tied-embedding policy {tied_policy!r} (choose from {', '.join(TIED_POLICIES)})")
    if problems:
        raise UsageError("; ".join(problems))


def build_param_groups(model: nn.Module, base_lr: float, gamma: float = 1.0, weight_decay: float = 0.0, *,
                       tied_policy: str = DEFAULT_TIED_POLICY, min_scale: float = 0.0,
                       freeze_below: float = 0.0, block_path: str | None = None) -> LLRDPlan:
    """Optimizer param groups with layer-wise LR decay: ``torch.optim.AdamW(plan.groups, lr=base_lr)``.

    Each group stores its absolute ``lr = base_lr * scale`` where, for N blocks,
    block i → ``gamma ** (N - 1 - i)``, embeddings → ``gamma ** (N - 1)``, head/final norm → 1, and
    ``scale = max(scale, min_scale)``. Example: N = 4, gamma = 0.5, base_lr = 1e-3 gives block_3 1e-3,
    block_2 5e-4, block_1 2.5e-4, block_0 and embeddings 1.25e-4, head 1e-3.

    Weight decay goes only to matrices (no biases, norms, 1-D tensors), as in HF's Trainer; with
    ``weight_decay == 0`` each depth is one group, otherwise up to two (``<depth>`` and ``<depth>.no_decay``).
    Only trainable parameters are grouped. A tied input/output embedding matrix gets the embeddings LR
    (``tied_policy="embedding"``) or ``base_lr`` (``"head"``).

    ``freeze_below`` MUTATES the model: every parameter whose scale is below it gets
    ``requires_grad=False`` and is left out of the groups (no AdamW state for it).

    If the block list cannot be found: ``ModelStructureError`` when gamma < 1, min_scale > 0 or
    freeze_below > 0; otherwise (plain γ = 1) a flat plan (``structure_found=False``) with a warning.
    """
    _check_args(base_lr, gamma, weight_decay, tied_policy, min_scale, freeze_below)
    gamma, base_lr, weight_decay = float(gamma), float(base_lr), float(weight_decay)
    warnings: list[str] = []
    try:
        path, blocks = find_block_list(model, block_path)
    except ModelStructureError as err:
        if gamma < 1.0 or min_scale > 0 or freeze_below > 0:
            raise
        path, blocks = None, None
        warnings.append(f"LLRD: block structure not resolved, using one flat LR group (exact for γ = 1). {err}")
    n_cfg = _config_num_layers(model)
    if blocks is not None and n_cfg is not None and len(blocks) != n_cfg:
        warnings.append(f"LLRD: block list {path} has {len(blocks)} blocks but the config says {n_cfg}; "
                        f"using N = {len(blocks)}")
    n = len(blocks) if blocks is not None else 0

    # One id → depth dict for block parameters (identity, so wrapper prefixes do not matter).
    depth_of: dict[int, int] = {}
    for i, block in enumerate(blocks if blocks is not None else []):
        for p in block.parameters():
            depth_of[id(p)] = i + 1
    in_emb, out_emb = _io_embeddings(model)
    in_ids = {id(p) for p in in_emb.parameters()} if in_emb is not None else set()
    out_ids = {id(p) for p in out_emb.parameters()} if out_emb is not None else set()
    in_w, out_w = getattr(in_emb, "weight", None), getattr(out_emb, "weight", None)
    tied = isinstance(in_w, torch.Tensor) and isinstance(out_w, torch.Tensor) and (
        in_w is out_w or (in_w.device.type != "meta" and in_w.data_ptr() != 0 and in_w.data_ptr() == out_w.data_ptr()
                          and in_w.shape == out_w.shape))
    tied_ids = {id(in_w), id(out_w)} if tied else set()
    norm_ids = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) or "Norm" in type(m).__name__
                for p in m.parameters(recurse=False)}

    def scale_of(depth: int) -> float:
        raw = 1.0 if depth > n else gamma ** (n - max(depth, 1))
        return max(raw, min_scale)

    head = n + 1
    buckets: dict[tuple[int, bool], list[tuple[str, torch.Tensor]]] = {}
    counts = [[0, 0] for _ in range(n + 2)]  # [elements, tensors] per depth
    tied_param_name, tied_depth, frozen, saved = None, None, [], 0
    seen_block = False
    for name, p in model.named_parameters():
        if blocks is None:
            depth = 0
        elif id(p) in depth_of:
            depth, seen_block = depth_of[id(p)], True
        elif id(p) in tied_ids:
            depth = 0 if tied_policy == "embedding" else head
        elif id(p) in out_ids:
            depth = head
        elif id(p) in in_ids:
            depth = 0
        elif _AFTER_HINT.search(_strip(name)):
            depth = head
        elif _BEFORE_HINT.search(_strip(name)):
            depth = 0
        else:
            depth = head if seen_block else 0
        if id(p) in tied_ids and tied_param_name is None:
            tied_param_name, tied_depth = name, depth
        if not p.requires_grad:
            continue
        counts[depth][0] += p.numel()
        counts[depth][1] += 1
        if blocks is not None and scale_of(depth) < freeze_below:
            p.requires_grad_(False)
            frozen.append(name)
            saved += 2 * p.numel() * p.element_size()
            continue
        decay = weight_decay > 0 and p.ndim >= 2 and id(p) not in norm_ids and not _NO_DECAY.search(name.lower())
        buckets.setdefault((depth, decay), []).append((name, p))

    def depth_name(depth: int) -> str:
        if blocks is None:
            return "all"
        return "embeddings" if depth == 0 else "head" if depth == head else f"block_{depth - 1}"

    depths = range(n + 2) if blocks is not None else range(1)
    groups, param_names, rows = [], {}, []
    for depth in depths:
        scale = scale_of(depth) if blocks is not None else 1.0
        for decay in (True, False):
            members = buckets.get((depth, decay))
            if not members:
                continue
            gname = depth_name(depth) + ("" if decay or weight_decay == 0 else ".no_decay")
            groups.append({"params": [p for _, p in members], "lr": base_lr * scale,
                           "weight_decay": weight_decay if decay else 0.0, "name": gname, "scale": scale,
                           "depth": depth})
            param_names[gname] = [nm for nm, _ in members]
        rows.append({"block": depth_name(depth), "depth": depth, "n_params": counts[depth][0],
                     "n_tensors": counts[depth][1], "lr": base_lr * scale, "scale": scale,
                     "weight_decay": weight_decay, "frozen": blocks is not None and scale < freeze_below,
                     "tied": tied and tied_depth == depth,
                     "trainable": bool(buckets.get((depth, True)) or buckets.get((depth, False)))})

    if blocks is not None and n and gamma ** (n - 1) < 1e-3 and min_scale == 0 and freeze_below == 0:
        warnings.append(f"LLRD: the lowest LR scale is γ^{n - 1} = {gamma ** (n - 1):.2g}, so the bottom blocks and "
                        f"embeddings barely train; consider --llrd-min-scale (e.g. 0.01) or --llrd-freeze-below")
    num_layers = n if blocks is not None else (n_cfg or 0)
    tied_lr = None if not tied else base_lr * (scale_of(tied_depth) if blocks is not None else 1.0)
    return LLRDPlan(groups=groups, param_names=param_names, rows=rows, num_layers=num_layers, block_path=path,
                    base_lr=base_lr, gamma=gamma, weight_decay=weight_decay, tied=tied, tied_policy=tied_policy,
                    tied_param_name=tied_param_name, tied_lr=tied_lr, min_scale=float(min_scale),
                    freeze_below=float(freeze_below), frozen_param_names=frozen, frozen_state_bytes_saved=saved,
                    warnings=warnings, structure_found=blocks is not None)
