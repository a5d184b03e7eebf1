"""Merging a tuned model back toward its base, after training: a torch-only library.

Every tensor becomes

    θ = θ_base + s · (θ_tuned − θ_base)

with s from ``merge_scales`` (scales.py): alpha everywhere (WiSE-FT, Wortsman et al. 2022), alpha · γ^(N-1-i) for
block i of N (the layer-decay plan applied after training), or linear in depth from bottom_alpha at block 0 to
alpha at the top (LiNeS, Wang et al. 2024); embeddings move like block 0, the head and final norm by alpha.

Worked example, N = 4 blocks, alpha = 0.5, γ = 0.5: blocks 0..3 get s = 0.0625, 0.125, 0.25, 0.5; a weight that is
1.0 in the base and 3.0 in the tuned model becomes 1.125 in block 0 and 2.0 in block 3.

The merge streams (interpolate.py, tensors.py): each tensor is read from the two safetensors files, merged and
written, so memory holds a few tensors, not the models. The command line is ``posttrainllm merge``
(posttrainllm/commands/merge.py).
"""

from posttrainllm.merging.interpolate import (
    NonFiniteTensor,
    TensorMismatch,
    first_mismatch,
    interpolate,
    merge_streamed,
)
from posttrainllm.merging.scales import SCHEDULES, MergeArgumentError, MergeScales, merge_scales
from posttrainllm.merging.tensors import (
    SafetensorsSource,
    StateDictSource,
    TensorFileError,
    planned_weight_files,
    write_streamed,
)

__all__ = [
    "SCHEDULES",
    "MergeArgumentError",
    "MergeScales",
    "NonFiniteTensor",
    "SafetensorsSource",
    "StateDictSource",
    "TensorFileError",
    "TensorMismatch",
    "first_mismatch",
    "interpolate",
    "merge_scales",
    "merge_streamed",
    "planned_weight_files",
    "write_streamed",
]
