"""The library's errors: each a ``ValueError`` (the public API raised ValueError before), carrying what it is about so
a caller (the CLI) maps it to its own words by field, never by message text."""

from __future__ import annotations


class LLRDArgumentError(ValueError):
    """An invalid argument of ``build_param_groups`` (or ``gamma_for_bottom_scale``). ``field`` is the argument's
    name (``"gamma"``, ``"lr_groups"``, ``"loraplus_ratio"``, ``"block_path"``, ...); ``fields`` lists every
    argument at fault when several are (the message then names each problem, joined by "; ")."""

    def __init__(self, field: str, message: str, *, fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.field = field
        self.fields = tuple(fields) or (field,)


class BlockStructureError(ValueError):
    """The block list of a model could not be resolved. ``candidates`` are the ``(path, length)`` of the model's
    ModuleLists/Sequentials; ``unmatched`` the parameter names that no block holds; ``field`` the argument that names
    the list instead (``"block_path"`` for the decoder's blocks, ``"vision_block_path"`` for a vision tower's)."""

    def __init__(self, message: str, *, model_name: str = "", candidates=(), unmatched=(), field: str = "block_path"):
        super().__init__(message)
        self.field = field
        self.model_name = model_name
        self.candidates = list(candidates)
        self.unmatched = list(unmatched)
