"""Options of the panel: what to train on: model, data, output directory."""

from __future__ import annotations

from posttrainllm.config.checks import (
    POST_TRAINING,
    TRAINING,
    fraction_below_one,
    positive_int,
)
from posttrainllm.config.opt import Opt

INPUTS: tuple[Opt, ...] = (
    Opt(
        "model",
        str,
        None,
        "Model to start from: a local directory or a Hugging Face hub id.",
        POST_TRAINING,
        metavar="PATH_OR_HUB_ID",
        required=True,
        panel="Inputs",
    ),
    Opt(
        "dataset",
        str,
        None,
        "Training data: a local file (.json .jsonl .csv .parquet .txt) or a hub dataset id.",
        TRAINING,
        metavar="PATH_OR_HUB_ID",
        required=True,
        panel="Inputs",
    ),
    Opt(
        "output_dir",
        str,
        None,
        "Directory for the trained model, checkpoints and run records "
        "(default: runs/COMMAND-NAME, NAME from --model, or --dataset for pretrain).",
        TRAINING,
        metavar="DIR",
        panel="Inputs",
    ),
    Opt(
        "eval_dataset",
        str,
        None,
        "Separate validation data (same shape as --dataset).",
        TRAINING,
        metavar="PATH_OR_HUB_ID",
        panel="Inputs",
    ),
    Opt(
        "eval_split",
        float,
        0.0,
        "Fraction of --dataset held out for validation (0 = none).",
        TRAINING,
        fraction_below_one,
        "FRACTION",
        panel="Inputs",
    ),
    Opt(
        "max_samples",
        int,
        None,
        "Use at most this many training examples.",
        TRAINING,
        positive_int,
        "N",
        panel="Inputs",
    ),
    Opt(
        "streaming",
        bool,
        False,
        "Read --dataset (and --replay-dataset) as a stream, converted as "
        "training reads it: for corpora bigger than RAM or disk. Needs "
        "--max-steps; --eval-split takes the eval rows from the head of the stream.",
        TRAINING,
        panel="Inputs",
    ),
    Opt(
        "dataset_num_proc",
        int,
        1,
        "Processes for converting and tokenizing the data (datasets' num_proc, also used for TRL's tokenization).",
        TRAINING,
        positive_int,
        "N",
        panel="Inputs",
    ),
    Opt(
        "ref_model",
        str,
        None,
        "DPO / KTO reference model (default: a frozen copy of --model).",
        ("dpo", "kto"),
        metavar="PATH_OR_HUB_ID",
        panel="Inputs",
    ),
    Opt(
        "model_config",
        str,
        "small",
        "Preset (tiny, small, base) or a config.json path for the from-scratch model.",
        ("pretrain",),
        metavar="PRESET_OR_PATH",
        panel="Inputs",
    ),
    Opt(
        "vocab_size",
        int,
        4096,
        "Vocabulary size of the byte-level BPE tokenizer trained on the corpus.",
        ("pretrain",),
        positive_int,
        "N",
        panel="Inputs",
    ),
    Opt(
        "trust_remote_code",
        bool,
        False,
        "Allow model repositories to run their own Python code (off by default).",
        POST_TRAINING + ("eval", "generate"),
        panel="Inputs",
    ),
    Opt(
        "allow_new_weights",
        bool,
        False,
        "Fine-tune even when the config and the weights disagree: weights the checkpoint lacks start random "
        "(e.g. a new head), weights the model lacks are dropped (off: an error naming them).",
        POST_TRAINING,
        panel="Inputs",
    ),
)
