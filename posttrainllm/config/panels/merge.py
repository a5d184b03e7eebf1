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
from posttrainllm.config.opt import PATH, Opt
from posttrainllm.constants import DEFAULT_TIED_POLICY, TIED_POLICIES
from posttrainllm.spec import own

MERGE_SCHEDULES = ("geometric", "linear", "uniform")
_CMD = own("merge")
_PANEL = "Merge"

MERGE: tuple[Opt, ...] = (
    Opt(
        name="base",
        type=str,
        default=None,
        help="The base model, before fine-tuning: a local directory, .gguf file or hub id.",
        commands=_CMD,
        metavar="PATH_OR_HUB_ID",
        required=True,
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="model",
        type=str,
        default=None,
        help="The tuned model: a local directory, .gguf file or hub id, or a LoRA adapter directory (merged into "
        "--base first). Same architecture, tensor names and shapes, and tokenizer as --base.",
        commands=_CMD,
        metavar="PATH_OR_HUB_ID",
        required=True,
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="output_dir",
        type=str,
        default=None,
        help="Directory for the merged model (several --alpha values: one alpha-A/ folder each). Never --base or "
        "--model, nor inside them.",
        commands=_CMD,
        metavar="DIR",
        required=True,
        panel="Inputs",
    ),
    Opt(
        name="alpha",
        type=list,
        default=None,
        help="How far to move from --base toward --model, in [0, 1]: θ = θ_base + s·(θ_tuned − θ_base) with s = A "
        "(WiSE-FT; 1 = the tuned model, 0 = the base). Several (comma-separated, e.g. 0.25,0.5,0.75,1.0): a "
        "sweep, one merged model each. A depth schedule sets s per block, with A at the top block. Not with "
        "--max-forgetting, which chooses the α of one uniform merge itself.",
        commands=_CMD,
        check=unit_interval,
        metavar="A[,A...]",
        required=True,
        required_unless="max_forgetting",
        panel=_PANEL,
        item=float,
        split=True,
    ),
    Opt(
        name="llrd",
        type=float,
        default=1.0,
        help=f"Geometric depth schedule (layer decay after training), γ in {LLRD_RANGE}: block i of N gets "
        f"s = A·γ^(N-1-i), embeddings block 0's s, head and final norm A. Absent: 1.0 (uniform). Bare --llrd: "
        f"{LLRD_BARE}.",
        commands=_CMD,
        check=llrd_range,
        metavar="[GAMMA]",
        bare=LLRD_BARE,
        panel=_PANEL,
    ),
    Opt(
        name="llrd_bottom_scale",
        type=float,
        default=0.0,
        help="Geometric schedule given by block 0's share S of A instead of γ: γ = S^(1/(N-1)) (γ must land in "
        f"{LLRD_RANGE}); not with --llrd.",
        commands=_CMD,
        check=bottom_scale,
        metavar="S",
        panel=_PANEL,
    ),
    Opt(
        name="depth_schedule",
        type=str,
        default="geometric",
        help="geometric (--llrd γ; uniform when γ = 1), linear (LiNeS: s goes linearly from --bottom-alpha at block 0 "
        "to A at the top block; embeddings get block 0's s, the head A) or uniform (s = A everywhere, WiSE-FT).",
        commands=_CMD,
        check=one_of(MERGE_SCHEDULES),
        metavar="SCHEDULE",
        panel=_PANEL,
    ),
    Opt(
        name="bottom_alpha",
        type=float,
        default=None,
        help="The linear schedule's s at block 0, in [0, 1] (needs --depth-schedule linear).",
        commands=_CMD,
        check=unit_interval,
        metavar="B",
        panel=_PANEL,
    ),
    Opt(
        name="tied_embeddings",
        type=str,
        default=DEFAULT_TIED_POLICY,
        help="A tied input/output embedding matrix moves like the embeddings ('embedding', block 0's s, as in "
        "training) or like the head ('head', A).",
        commands=_CMD,
        check=one_of(TIED_POLICIES),
        metavar="POLICY",
        panel=_PANEL,
    ),
    Opt(
        name="llrd_blocks",
        type=str,
        default=None,
        help="Dotted path of the decoder block list when it cannot be found (e.g. model.layers).",
        commands=_CMD,
        metavar="PATH",
        panel=_PANEL,
    ),
    Opt(
        name="eval_dataset",
        type=str,
        default=None,
        help="In-domain evaluation set (prompt/completion or Alpaca records): its completion loss is measured for "
        "every merge and for --base.",
        commands=_CMD,
        metavar="FILE",
        panel="Evaluation",
        input=PATH,
    ),
    Opt(
        name="ood_eval",
        type=list,
        default=[],
        help="Held-out text file (repeatable): perplexity and the per-token KL(base ‖ merge) of every merge.",
        commands=_CMD,
        metavar="FILE",
        panel="Evaluation",
        input=PATH,
    ),
    Opt(
        name="eval_cache",
        type=str,
        default=None,
        help="Folder where the base's held-out evaluation is kept and reused across merges and runs (see sft's "
        "--eval-cache); posttrainllm sweep sets it.",
        commands=_CMD,
        metavar="DIR",
        panel="Evaluation",
    ),
    Opt(
        name="max_length",
        type=int,
        default=512,
        help="Evaluation window in tokens.",
        commands=_CMD,
        check=positive_int,
        metavar="N",
        panel="Evaluation",
    ),
    Opt(
        name="eval_batch_size",
        type=int,
        default=8,
        help="Windows per forward pass.",
        commands=_CMD,
        check=positive_int,
        metavar="N",
        panel="Evaluation",
    ),
    Opt(
        name="discard_weights",
        type=bool,
        default=False,
        help="Keep only the measurements, not the merged weights (needs --eval-dataset or --ood-eval).",
        commands=_CMD,
        panel="Evaluation",
    ),
    Opt(
        name="overwrite",
        type=bool,
        default=False,
        help="Replace a previous merge in --output-dir (only what posttrainllm wrote; replaced once the new one is "
        "done).",
        commands=_CMD,
        panel="Run",
    ),
    Opt(
        name="trust_remote_code",
        type=bool,
        default=False,
        help="Allow model repositories to run their own Python code (off by default).",
        commands=_CMD,
        panel="Run",
    ),
    Opt(
        name="recipe",
        type=str,
        default=None,
        help="YAML recipe: a file, or the name of a bundled recipe (`posttrainllm recipes` lists them); keys are these "
        "option names; command-line flags override it.",
        commands=_CMD,
        metavar="FILE|NAME",
        panel="Run",
        recipe=False,
    ),
)

PANEL, ORDER = MERGE, 110  # this panel's options, and its place in the help (config/panels/__init__.py)
