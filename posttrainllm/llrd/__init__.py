"""Layer-wise learning-rate decay (LLRD): optimizer parameter groups by depth. A torch-only library.

A model with N blocks (its block list, e.g. ``model.layers``) is cut into N + 2 depths:

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

Two more factors compose with the depth scale, by what a parameter is rather than where it sits:

    lr = base_lr * depth_scale * pattern_factor * loraplus_factor

``lr_groups={"mlp": 0.5}`` multiplies every parameter whose (wrapper-stripped) name matches the regex ``mlp`` by
0.5 (a factor 0 freezes); ``loraplus_ratio=16`` trains LoRA's B matrices (``lora_B``, ``lora_embedding_B``) at 16x
their depth's LR (LoRA+, Hayou et al. 2024). E.g. N = 4, gamma = 0.5, base_lr = 1e-3, ``lr_groups={"mlp": 0.5}``:
``layers.1.mlp.up_proj.weight`` trains at 1e-3 * 0.5**2 * 0.5 = 1.25e-4.

Vision-language models (a config with ``vision_config``: Qwen2-VL, LLaVA, Idefics3, ...) get a schedule per tower
(``llrd.towers`` finds them from the configs and module types, not from names). With M vision blocks:

    scale(vision block j)      = gamma_v ** (M - 1 - j)    (gamma_v = vision_gamma, default gamma; top block: 1)
    scale(vision embeddings)   = gamma_v ** (M - 1)        (patch/position embeddings, pre-norm: block 0's scale)
    scale(vision post-norm)    = 1                         (a norm after the tower's blocks: the top block's scale)
    scale(projector)           = projector_scale           (default 1; 0 freezes)
    language decoder           = the text schedule above, over its own N blocks, with gamma

The top vision block trains at the base LR (``vision_top = 1``), as the top decoder block does: each tower decays
from the projector down, by its own depth, and ``projector_scale`` moves the projector alone. The clamp
(``min_scale``) and ``freeze_below`` apply to the vision depths as to the text ones; ``freeze_vision=True`` plans
the whole tower frozen (``apply_freeze`` sets ``requires_grad=False``). Qwen2-VL's ``visual.merger`` sits inside the
vision module but is the aligner: it is the projector.

Worked example, M = 2, N = 3, gamma = 0.5, gamma_v = 0.8, projector_scale = 2, base_lr = 1e-3:
vision.embeddings and vision.block_0 8e-4, vision.block_1 1e-3, projector 2e-3, embeddings and block_0 2.5e-4,
block_1 5e-4, block_2 and head 1e-3.

Use in your own training loop::

    from posttrainllm import build_param_groups

    plan = build_param_groups(model, base_lr=3e-5, gamma=0.9, weight_decay=0.01)
    optimizer = torch.optim.AdamW(plan.groups)          # each group carries its absolute "lr"
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step / 100))
    print(plan.to_json())                               # group name, lr, weight decay, parameter names
    # a vision-language model: its own decay for the vision tower, a factor for the projector
    plan = build_param_groups(vlm, base_lr=1e-5, gamma=0.9, vision_gamma=0.8, projector_scale=5.0)

How the structure is found:

* The block list comes from the modules, never from which parameters happen to be trainable, so LoRA adapters
  inside block i train at block i's LR. Among the ``ModuleList``/``Sequential`` containers whose length equals
  the config's layer count, known paths (``model.layers``, ``transformer.h``, ...) come first.
* Hierarchical models (ConvNeXt / Swin style: a list of stages, each holding its own list of blocks of one
  class) get depth over the concatenated blocks of all stages, as timm's ``group_matcher`` does; stage-level
  parameters (downsampling) take the depth of the stage's first block when registered before its blocks, of its
  last block otherwise. A chosen list holding well under half of the non-embedding parameters is refused as
  ambiguous rather than silently mis-split.
* Wrapper prefixes (PEFT ``base_model.model.``, FSDP ``_fsdp_wrapped_module.``, activation checkpointing
  ``_checkpoint_wrapped_module.``, torch.compile ``_orig_mod.``, DDP ``module.``) are transparent.
* A tied input/output embedding matrix gets the embeddings' LR (``tied_policy="embedding"``, the default) or the
  head's (``"head"``).

Weight decay goes to matrices only: not to biases, norm weights, 1-D tensors, nor to ViT-style token and
position tensors (``cls_token``, ``pos_embed``, ``position_embeddings`` parameters, ... and whatever a model's
``no_weight_decay()`` lists), as in timm and the MAE/BEiT recipes.

Planning has no side effects: ``build_param_groups`` never changes the model. ``freeze_below`` only *plans*
freezing (those parameters are left out of the groups and listed in ``plan.frozen_param_names``);
``apply_freeze(plan)`` is the separate step that sets ``requires_grad=False`` on them.

The library accepts any ``gamma`` in (0, 1]. (The ``posttrainllm`` command line narrows it to [0.5, 1.0].)
Invalid arguments raise ``LLRDArgumentError`` (a ``ValueError`` whose ``field`` names the argument); a model whose
blocks cannot be found raises ``BlockStructureError`` (a ``ValueError``) when the requested decay needs them.

The package: ``structure`` finds the blocks and gives every parameter its depth (like timm's ``group_matcher``),
``towers`` finds a vision-language model's vision tower, projector and decoder, ``plan`` holds ``LLRDPlan`` and its
report rows, ``build`` validates once, scales, buckets (``build_param_groups``).
"""

from posttrainllm.constants import DEFAULT_TIED_POLICY, TIED_POLICIES
from posttrainllm.llrd.build import build_param_groups, gamma_for_bottom_scale
from posttrainllm.llrd.errors import BlockStructureError, LLRDArgumentError
from posttrainllm.llrd.plan import LLRDPlan, apply_freeze, layer_decay_requested
from posttrainllm.llrd.structure import find_block_list, strip_wrappers
from posttrainllm.llrd.towers import count_blocks, find_towers, vlm_configs

__all__ = [
    "BlockStructureError",
    "LLRDArgumentError",
    "LLRDPlan",
    "TIED_POLICIES",
    "DEFAULT_TIED_POLICY",
    "apply_freeze",
    "build_param_groups",
    "count_blocks",
    "find_block_list",
    "find_towers",
    "gamma_for_bottom_scale",
    "layer_decay_requested",
    "strip_wrappers",
    "vlm_configs",
]
