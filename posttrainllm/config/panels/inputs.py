"""Options of the panel: what to train on: model, data, output directory."""

from __future__ import annotations

from posttrainllm.config.checks import (
    fraction_below_one,
    positive_int,
    seed_range,
)
from posttrainllm.config.opt import PATH, Opt
from posttrainllm.spec import FROM_SCRATCH, OFFLINE_DATA, POST_TRAINING, REFERENCE_MODEL, TEACHER, TRAINING, own

INPUTS: tuple[Opt, ...] = (
    Opt(
        name="model",
        type=str,
        default=None,
        help="Model to start from: a local directory, a GGUF file (.gguf, converted once and cached) or a Hugging Face "
        "hub id.",
        commands=POST_TRAINING,
        metavar="PATH_OR_HUB_ID",
        required=True,
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="dataset",
        type=str,
        default=None,
        help="Training data: a local file (.json .jsonl .csv .parquet .txt) or a hub dataset id.",
        commands=TRAINING,
        metavar="PATH_OR_HUB_ID",
        required=True,
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="output_dir",
        type=str,
        default=None,
        help="Directory for the trained model, checkpoints and run records "
        "(default: runs/COMMAND-NAME, NAME from --model, or --dataset for pretrain).",
        commands=TRAINING,
        metavar="DIR",
        panel="Inputs",
    ),
    Opt(
        name="eval_dataset",
        type=str,
        default=None,
        help="Separate validation data (same shape as --dataset).",
        commands=TRAINING,
        metavar="PATH_OR_HUB_ID",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="eval_split",
        type=float,
        default=0.0,
        help="Fraction of --dataset held out for validation (0 = none).",
        commands=TRAINING,
        check=fraction_below_one,
        metavar="FRACTION",
        panel="Inputs",
    ),
    Opt(
        name="eval_split_seed",
        type=int,
        default=0,
        help="Seed of the rows --eval-split draws, apart from --seed: runs of different --seed are scored on the same "
        "eval rows. Raw text (finetune, pretrain) always holds out its last blocks.",
        commands=TRAINING,
        check=seed_range,
        metavar="N",
        panel="Inputs",
    ),
    Opt(
        name="max_samples",
        type=int,
        default=None,
        help="Use at most this many training examples.",
        commands=TRAINING,
        check=positive_int,
        metavar="N",
        panel="Inputs",
    ),
    Opt(
        name="streaming",
        type=bool,
        default=False,
        help="Read --dataset (and --replay-dataset) as a stream, converted as "
        "training reads it: for corpora bigger than RAM or disk. Needs "
        "--max-steps; --eval-split takes the eval rows from the head of the stream.",
        commands=OFFLINE_DATA,
        panel="Inputs",
    ),
    Opt(
        name="dataset_num_proc",
        type=int,
        default=1,
        help="Processes for converting and tokenizing the data (datasets' num_proc, also used for TRL's tokenization).",
        commands=TRAINING,
        check=positive_int,
        metavar="N",
        panel="Inputs",
    ),
    Opt(
        name="ref_model",
        type=str,
        default=None,
        help="DPO / KTO reference model: a local directory, GGUF file or hub id (default: a frozen copy of --model).",
        commands=REFERENCE_MODEL,
        metavar="PATH_OR_HUB_ID",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="teacher",
        type=str,
        default=None,
        help="Teacher model for distill: a local directory, hub id or GGUF file, with the student's vocabulary.",
        commands=TEACHER,
        metavar="PATH_OR_HUB_ID",
        required=True,
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="model_config",
        type=str,
        default="small",
        help="Preset (tiny, small, base) or a config.json path for the from-scratch model.",
        commands=FROM_SCRATCH,
        metavar="PRESET_OR_PATH",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="vocab_size",
        type=int,
        default=4096,
        help="Vocabulary size of the byte-level BPE tokenizer trained on the corpus.",
        commands=FROM_SCRATCH,
        check=positive_int,
        metavar="N",
        panel="Inputs",
    ),
    Opt(
        name="trust_remote_code",
        type=bool,
        default=False,
        help="Allow model repositories to run their own Python code (off by default).",
        commands=POST_TRAINING | own("eval") | own("generate"),
        panel="Inputs",
    ),
    Opt(
        name="allow_new_weights",
        type=bool,
        default=False,
        help="Fine-tune even when the config and the weights disagree: weights the checkpoint lacks start random "
        "(e.g. a new head), weights the model lacks are dropped (off: an error naming them).",
        commands=POST_TRAINING,
        panel="Inputs",
    ),
)

PANEL, ORDER = INPUTS, 10  # this panel's options, and its place in the help (config/panels/__init__.py)
