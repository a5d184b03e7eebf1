"""Vision-language models: the vision tower, the projector and the language decoder, found from the model. Torch only.

A model is a vision-language model (VLM) when its config has a ``vision_config``. Then:

* **the vision tower** is the outermost submodule whose ``config`` is that ``vision_config`` (Qwen2-VL's
  ``model.visual``, LLaVA's ``model.vision_tower``, Idefics3's ``model.vision_model``); its **blocks** are the list
  inside it of one block class whose length is the vision config's depth (``num_hidden_layers`` / ``depth``).
  ``vision_block_path`` names the block list instead (the tower is then the highest module above it that holds no
  language parameter);
* **the language decoder** is the outermost submodule whose ``config`` is the ``text_config``; its blocks are found
  there as for a text model (``block_path`` names them instead);
* **the projector** (aligner) is every other parameter: neither in the vision tower nor in the language decoder nor
  the output head (LLaVA's ``multi_modal_projector``, Idefics3's ``connector``). Inside the tower, a submodule after
  the blocks that is more than a norm and whose last Linear maps into the decoder's width is the projector too
  (Qwen2-VL's ``visual.merger``: a norm and an MLP into the decoder's width: the aligner); a norm after the blocks
  (CLIP/SigLIP ``post_layernorm``) or another head of the tower (SigLIP's pooling head) belongs to the top vision
  block. (When the vision and decoder widths are equal, such a head counts as the projector.)

Every parameter lands in exactly one of: vision embeddings (the tower's parameters before its blocks: patch and
position embeddings, class embedding, pre-norm), vision block j, projector, or a text depth (embeddings, block i,
head). No name is matched: only configs, module identity, registration order and module types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import nn

from posttrainllm.llrd.errors import BlockStructureError, LLRDArgumentError
from posttrainllm.llrd.structure import _first, _is_list, _Layout, _numel, _resolve_blocks, find_block_list

VISION_DEPTH_KEYS = ("num_hidden_layers", "depth", "num_layers")  # a vision config's block count, first found wins


@dataclass
class Towers:
    """Where the towers are: the text layout, the vision blocks (``vision_blocks[j]`` is block j) and each
    parameter's place (by id): ``vision`` maps a tower parameter to 0 (embeddings) or j + 1 (block j);
    ``projector`` holds the projector's parameters."""

    text: _Layout
    vision_path: str
    vision_block_path: str
    vision_blocks: list[nn.Module]
    vision: dict[int, int] = field(default_factory=dict)
    projector: set[int] = field(default_factory=set)

    @property
    def m(self) -> int:
        return len(self.vision_blocks)

    def depths(self, n: int) -> dict[int, int]:
        """Plan depths of the vision and projector parameters for a decoder of ``n`` blocks: N + 2 vision
        embeddings, N + 3 + j vision block j, N + M + 3 projector."""
        out = {pid: n + 2 + v for pid, v in self.vision.items()}
        out.update({pid: n + self.m + 3 for pid in self.projector})
        return out


@dataclass(frozen=True)
class VisionArgs:
    """The vision settings of ``build_param_groups`` (None: not given)."""

    gamma: float | None = None
    projector_scale: float | None = None
    freeze: bool = False
    block_path: str | None = None

    @property
    def projector(self) -> float:
        return 1.0 if self.projector_scale is None else float(self.projector_scale)

    def gamma_or(self, gamma: float) -> float:
        return float(gamma if self.gamma is None else self.gamma)

    def requested(self, gamma: float) -> bool:
        """Whether the settings make a vision or projector LR differ from the base LR, or freeze the tower."""
        return self.gamma_or(gamma) < 1 or self.projector != 1 or bool(self.freeze)

    def checked(self, model: nn.Module) -> VisionArgs:
        """Itself, once each value is in range and the model has a vision tower to apply them to; otherwise an
        ``LLRDArgumentError`` naming every argument at fault."""
        problems: list[tuple[str, str]] = []
        if self.gamma is not None and not (_finite(self.gamma) and 0 < self.gamma <= 1):
            problems.append(("vision_gamma", f"vision_gamma must be in (0, 1], got {self.gamma!r}"))
        if self.projector_scale is not None and not (_finite(self.projector_scale) and self.projector_scale >= 0):
            why = f"projector_scale must be a finite number >= 0 (0 freezes), got {self.projector_scale!r}"
            problems.append(("projector_scale", why))
        if not problems and vlm_configs(model)[0] is None and not self.block_path:
            given = [
                f for f, v in (("vision_gamma", self.gamma), ("projector_scale", self.projector_scale)) if v is not None
            ] + (["freeze_vision"] if self.freeze else [])
            if given:
                raise LLRDArgumentError(
                    given[0],
                    f"{type(model).__name__} has no vision tower (its config has no vision_config): "
                    "the vision settings apply to vision-language models only; drop them",
                    fields=tuple(given),
                )
        if problems:
            fields = tuple(dict.fromkeys(f for f, _ in problems))
            raise LLRDArgumentError(fields[0], "; ".join(m for _, m in problems), fields=fields)
        return self

    def record(self, towers: Towers, vision_gamma: float) -> dict:
        """What the plan reports of the towers."""
        return {
            "gamma": vision_gamma,
            "projector_scale": self.projector,
            "freeze": bool(self.freeze),
            "num_layers": towers.m,
            "path": towers.vision_path,
            "block_path": towers.vision_block_path,
            "projector_params": len(towers.projector),
        }


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def vlm_configs(model: nn.Module):
    """``(vision_config, text_config)`` of the first (possibly wrapped) module whose config has a vision config;
    ``(None, None)`` for a text-only model."""
    for module in model.modules():
        cfg = getattr(module, "config", None)
        vcfg = getattr(cfg, "vision_config", None)
        if cfg is not None and vcfg is not None:
            tcfg = getattr(cfg, "text_config", None)
            if tcfg is None:
                try:
                    tcfg = cfg.get_text_config()
                except Exception:
                    tcfg = None
            return vcfg, tcfg
    return None, None


def _depth_of(model_config) -> int | None:
    for key in VISION_DEPTH_KEYS:
        value = model_config.get(key) if isinstance(model_config, dict) else getattr(model_config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _with_config(model: nn.Module, model_config) -> tuple[str, nn.Module] | None:
    """The outermost submodule (not the model itself) whose ``config`` is ``model_config`` (or equal to it)."""
    if model_config is None:
        return None
    found = [(n, m) for n, m in model.named_modules() if n and getattr(m, "config", None) is model_config]
    if not found:
        found = [
            (n, m)
            for n, m in model.named_modules()
            if n
            and type(getattr(m, "config", None)) is type(model_config)
            and getattr(m, "config", None) == model_config
        ]
    return found[0] if found else None


def _candidates(model: nn.Module) -> list[tuple[str, int]]:
    return [(n, len(m)) for n, m in model.named_modules() if _is_list(m)]


def _tower_error(model: nn.Module, what: str) -> BlockStructureError:
    with_cfg = [
        f"{n} ({type(getattr(m, 'config', None)).__name__})"
        for n, m in model.named_modules()
        if n and hasattr(m, "config")
    ]
    cands = _candidates(model)
    return BlockStructureError(
        f"{what} in {type(model).__name__}. Submodules with a config: {_first(with_cfg, 8) or 'none'}. "
        f"ModuleLists in the model: {_first([f'{n} ({k})' for n, k in cands], 12) or 'none'}",
        model_name=type(model).__name__,
        candidates=cands,
        field="vision_block_path",
    )


def _vision_blocks(model: nn.Module, tower_path: str, tower: nn.Module, depth: int | None) -> tuple[str, nn.Module]:
    """The list of one block class inside the tower whose length is the vision depth (the largest if several)."""
    lists = [
        (n, m)
        for n, m in tower.named_modules()
        if _is_list(m) and len({type(b) for b in m}) == 1 and (depth is None or len(m) == depth)
    ]
    if not lists:
        wanted = f"M = {depth} blocks (vision_config)" if depth else "blocks"
        raise _tower_error(model, f"no list of {wanted} of one class inside the vision tower {tower_path}")
    name, blocks = max(lists, key=lambda item: _numel(item[1]))
    return f"{tower_path}.{name}", blocks


def _text_layout(model: nn.Module, tcfg, block_path: str | None, vision_ids: set[int]) -> tuple[_Layout, set[int]]:
    """The decoder's layout (paths as in ``model.named_modules()``) and the ids of the language decoder's parameters."""
    if block_path:
        layout = _resolve_blocks(model, block_path)
        lang = None
    else:
        lang = _with_config(model, tcfg)
        if lang is not None:
            inner = _resolve_blocks(lang[1], None)
            layout = _Layout(f"{lang[0]}.{inner.path}", inner.blocks, inner.extra, inner.hierarchical)
        else:
            path, blocks = find_block_list(model)
            layout = _Layout(path, list(blocks))
    if any(id(p) in vision_ids for b in layout.blocks for p in b.parameters()):
        raise BlockStructureError(
            f"the decoder block list {layout.path} lies inside the vision tower of {type(model).__name__}",
            model_name=type(model).__name__,
            candidates=_candidates(model),
        )
    if lang is None:  # no module carries the text config: the decoder is the block list's parent
        parent = layout.path.rsplit(".", 1)[0] if "." in layout.path else ""
        lang = (parent, model.get_submodule(parent) if parent else model)
    return layout, {id(p) for p in lang[1].parameters()}


def _tower_above(model: nn.Module, blocks_path: str, avoid: set[int]) -> tuple[str, nn.Module]:
    """The highest module above ``blocks_path`` that holds none of the ``avoid`` parameters."""
    parts = blocks_path.split(".")
    best = (blocks_path, model.get_submodule(blocks_path))
    for cut in range(len(parts) - 1, 0, -1):
        path = ".".join(parts[:cut])
        module = model.get_submodule(path)
        if any(id(p) in avoid for p in module.parameters()):
            break
        best = (path, module)
    return best


def _norm_only(module: nn.Module) -> bool:
    """Every parameter of ``module`` belongs to a norm layer (LayerNorm, RMSNorm, ...)."""
    norms = {
        id(p)
        for m in module.modules()
        if isinstance(m, nn.LayerNorm) or "Norm" in type(m).__name__
        for p in m.parameters(recurse=False)
    }
    params = list(module.parameters())
    return bool(params) and all(id(p) in norms for p in params)


def _out_width(module: nn.Module) -> int | None:
    """``out_features`` of the last Linear layer in ``module`` (None without one)."""
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    return linears[-1].out_features if linears else None


def _aligner(module: nn.Module, text_width: int | None) -> bool:
    """A tower submodule after the blocks is the aligner (projector) when it is more than a norm and, when the
    decoder's width is known, its last Linear maps into that width (Qwen2-VL's merger); otherwise (a norm, SigLIP's
    pooling head) it belongs to the top vision block."""
    if _norm_only(module):
        return False
    return text_width is None or _out_width(module) == text_width


def _place_tower(tower: nn.Module, blocks: nn.Module, text_width: int | None) -> tuple[dict[int, int], set[int]]:
    """Each tower parameter's vision depth (0 before the blocks, j + 1 in block j, M after them) and the ids of the
    tower's projector part (an aligner after the blocks, see ``_aligner``)."""
    m = len(blocks)
    depth: dict[int, int] = {}
    for j, block in enumerate(blocks):
        for p in block.parameters():
            depth.setdefault(id(p), j + 1)
    holds_blocks = {n for n, mod in tower.named_children() if any(id(p) in depth for p in mod.parameters())}
    children = dict(tower.named_children())
    projector: set[int] = set()
    seen = False
    for name, p in tower.named_parameters():
        if id(p) in depth:
            seen = True
            continue
        child = name.split(".")[0]
        if not seen:
            depth[id(p)] = 0
        elif child not in holds_blocks and child in children and _aligner(children[child], text_width):
            projector.add(id(p))
        else:
            depth[id(p)] = m
    return depth, projector


def find_towers(
    model: nn.Module,
    block_path: str | None = None,
    vision_block_path: str | None = None,
    out_ids: frozenset[int] | set[int] = frozenset(),
) -> Towers | None:
    """The towers of a vision-language model (None for a text-only one); ``out_ids`` are the output head's
    parameters (not the projector's). Raises ``BlockStructureError`` (``field`` ``"vision_block_path"`` for the vision
    tower, ``"block_path"`` for the decoder) when they cannot be found."""
    vcfg, tcfg = vlm_configs(model)
    if vcfg is None and not vision_block_path:
        return None
    depth = _depth_of(vcfg) if vcfg is not None else None
    if vision_block_path:
        try:
            blocks_path, blocks = find_block_list(model, vision_block_path)
        except LLRDArgumentError as e:  # the list named is the vision tower's, not the decoder's
            raise LLRDArgumentError("vision_block_path", str(e)) from None
        text, lang_ids = _text_layout(model, tcfg, block_path, {id(p) for p in blocks.parameters()})
        tower_path, tower = _tower_above(model, blocks_path, lang_ids | out_ids)
    else:
        found = _with_config(model, vcfg)
        if found is None:
            raise _tower_error(
                model,
                f"vision tower not found: no submodule has the vision config ({type(vcfg).__name__}) as its config",
            )
        tower_path, tower = found
        blocks_path, blocks = _vision_blocks(model, tower_path, tower, depth)
        text, lang_ids = _text_layout(model, tcfg, block_path, {id(p) for p in tower.parameters()})
    text_width = getattr(tcfg, "hidden_size", None) if tcfg is not None else None
    vision, in_tower_projector = _place_tower(tower, blocks, text_width if isinstance(text_width, int) else None)
    outside = {
        id(p)
        for p in model.parameters()
        if id(p) not in vision and id(p) not in in_tower_projector and id(p) not in lang_ids and id(p) not in out_ids
    }
    return Towers(text, tower_path, blocks_path, list(blocks), vision, in_tower_projector | outside)


def count_blocks(model: nn.Module, block_path: str | None = None) -> int:
    """N, the number of blocks layer decay counts in `model` (all stages' blocks for hierarchical models; the
    language decoder's blocks for a vision-language model)."""
    towers = find_towers(model, block_path) if vlm_configs(model)[0] is not None else None
    return len(towers.text.blocks if towers is not None else _resolve_blocks(model, block_path).blocks)
