"""posttrainllm: LLM post-training with layer-wise learning-rate decay.

The library part is torch-only and imported on first use, so `import posttrainllm` (and the CLI's --help) stay
cheap::

    from posttrainllm import build_param_groups
    plan = build_param_groups(model, base_lr=3e-5, gamma=0.9, weight_decay=0.01)
    optimizer = torch.optim.AdamW(plan.groups)
"""

__version__ = "0.1.0"

__all__ = [
    "BlockStructureError",
    "LLRDArgumentError",
    "LLRDPlan",
    "__version__",
    "apply_freeze",
    "build_param_groups",
    "count_blocks",
    "find_block_list",
    "gamma_for_bottom_scale",
]

_LIBRARY = set(__all__) - {"__version__"}


def __getattr__(name: str):
    if name in _LIBRARY:
        from posttrainllm import llrd

        return getattr(llrd, name)
    raise AttributeError(f"module 'posttrainllm' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LIBRARY)
