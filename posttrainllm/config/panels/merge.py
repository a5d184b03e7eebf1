"""Options of the panel: merge (post-hoc interpolation of a tuned model back toward its base, no training)."""

from __future__ import annotations

from posttrainllm.config.checks import (
    LLRD_BARE,
    LLRD_RANGE,
    bottom_scale,
    llrd_range,
    one_of,
    positive_int,
    unit_interval,
)
from posttrainllm.config.opt import Opt
from posttrainllm.constants import DEFAULT_TIED_POLICY, TIED_POLICIES

MERGE_SCHEDULES = ("geometric", "linear", "uniform")
_CMD = ("merge",)
_PANEL = "Merge"

MERGE: tuple[Opt, ...] = (
    Opt(
        "base",
        str,
        None,
        "The base model, before fine-tuning: a local directory, .gguf file or hub id.",
        _CMD,
        metavar="PATH_OR_HUB_ID",
        required=True,
        panel="Inputs",
    ),
    Opt(
        "model",
        str,
        None,
        "The tuned model: a local directory, .gguf file or hub id, or a LoRA adapter directory (merged into "
        "--base first). Same architecture, tensor names and shapes, and tokenizer as --base.",
        _CMD,
        metavar="PATH_OR_HUB_ID",
        required=True,
        panel="Inputs",
    ),
    Opt(
        "output_dir",
        str,
        None,
        "Directory for the merged model (several --alpha values: one alpha-A/ folder each). Never --base or --model, "
        "nor inside them.",
        _CMD,
        metavar="DIR",
        required=True,
        panel="Inputs",
    ),
    Opt(
        "alpha",
        list,
        None,
        "How far to move from --base toward --model, in [0, 1]: θ = θ_base + s·(θ_tuned − θ_base) with s = A "
        "(WiSE-FT; 1 = the tuned model, 0 = the base). Several (comma-separated, e.g. 0.25,0.5,0.75,1.0): a "
        "sweep, one merged model each. A depth schedule sets s per block, with A at the top block.",
        _CMD,
        unit_interval,
        "A[,A...]",
        required=True,
        panel=_PANEL,
        item=float,
        split=True,
    ),
    Opt(
        "llrd",
        float,
        1.0,
        f"Geometric depth schedule (layer decay after training), γ in {LLRD_RANGE}: block i of N gets "
        f"s = A·γ^(N-1-i), embeddings block 0's s, head and final norm A. Absent: 1.0 (uniform). Bare --llrd: "
        f"{LLRD_BARE}.",
        _CMD,
        llrd_range,
        "[GAMMA]",
        bare=LLRD_BARE,
        panel=_PANEL,
    ),
    Opt(
        "llrd_bottom_scale",
        float,
        0.0,
        "Geometric schedule given by block 0's share S of A instead of γ: γ = S^(1/(N-1)) (γ must land in "
        f"{LLRD_RANGE}); not with --llrd.",
        _CMD,
        bottom_scale,
        "S",
        panel=_PANEL,
    ),
    Opt(
        "depth_schedule",
        str,
        "geometric",
        "geometric (--llrd γ; uniform when γ = 1), linear (LiNeS: s goes linearly from --bottom-alpha at block 0 "
        "to A at the top block; embeddings get block 0's s, the head A) or uniform (s = A everywhere, WiSE-FT).",
        _CMD,
        one_of(MERGE_SCHEDULES),
        "SCHEDULE",
        panel=_PANEL,
    ),
    Opt(
        "bottom_alpha",
        float,
        None,
        "The linear schedule's s at block 0, in [0, 1] (needs --depth-schedule linear).",
        _CMD,
        unit_interval,
        "B",
        panel=_PANEL,
    ),
    Opt(
        "tied_embeddings",
        str,
        DEFAULT_TIED_POLICY,
        "A tied input/output embedding matrix moves like the embeddings ('embedding', block 0's s, as in training) "
        "or like the head ('head', A).",
        _CMD,
        one_of(TIED_POLICIES),
        "POLICY",
        panel=_PANEL,
    ),
    Opt(
        "llrd_blocks",
        str,
        None,
        "Dotted path of the decoder block list when it cannot be found (e.g. model.layers).",
        _CMD,
        metavar="PATH",
        panel=_PANEL,
    ),
    Opt(
        "eval_dataset",
        str,
        None,
        "In-domain evaluation set (prompt/completion or Alpaca records): its completion loss is measured for every "
        "merge and for --base.",
        _CMD,
        metavar="FILE",
        panel="Evaluation",
    ),
    Opt(
        "ood_eval",
        list,
        [],
        "Held-out text file (repeatable): perplexity and the per-token KL(base ‖ merge) of every merge.",
        _CMD,
        metavar="FILE",
        panel="Evaluation",
    ),
    Opt("max_length", int, 512, "Evaluation window in tokens.", _CMD, positive_int, "N", panel="Evaluation"),
    Opt("eval_batch_size", int, 8, "Windows per forward pass.", _CMD, positive_int, "N", panel="Evaluation"),
    Opt(
        "discard_weights",
        bool,
        False,
        "Keep only the measurements, not the merged weights (needs --eval-dataset or --ood-eval).",
        _CMD,
        panel="Evaluation",
    ),
    Opt(
        "overwrite",
        bool,
        False,
        "Replace a previous merge in --output-dir (only what posttrainllm wrote; replaced once the new one is done).",
        _CMD,
        panel="Run",
    ),
    Opt(
        "trust_remote_code",
        bool,
        False,
        "Allow model repositories to run their own Python code (off by default).",
        _CMD,
        panel="Run",
    ),
    Opt(
        "recipe",
        str,
        None,
        "YAML recipe: a file, or the name of a bundled recipe (`posttrainllm recipes` lists them); keys are these "
        "option names; command-line flags override it.",
        _CMD,
        metavar="FILE|NAME",
        panel="Run",
        recipe=False,
    ),
)
