"""The run configuration: one table of options, recipes, and validation.

Config flows one way: defaults < recipe (YAML, flat keys = option names) < command line.
Every problem (unknown recipe key, wrong type, value out of range) is collected and reported at once,
before any model or data is loaded. This module imports no torch/transformers.
"""

from __future__ import annotations

import math
import os
import re
import reprlib
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrainllm.constants import TIED_POLICIES
from posttrainllm.errors import ConfigErrors, UsageError, shorten
from posttrainllm.refs import looks_local

POST_TRAINING = ("sft", "dpo", "finetune")  # start from a model
TRAINING = POST_TRAINING + ("pretrain",)  # every command that trains
ALL_COMMANDS = ("pretrain", "sft", "dpo", "finetune", "eval", "generate", "demo")

LLRD_MIN, LLRD_MAX = 0.5, 1.0
LLRD_BARE = 0.95  # value of a bare `--llrd` (no number)
LLRD_RANGE = f"[{LLRD_MIN}, {LLRD_MAX}]"

SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "warmup_stable_decay",
)
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
REPORT_TO = ("none", "tensorboard", "wandb", "trackio", "all")


# ----------------------------------------------------------------------------------------------------------------
# checks: each returns None when fine, or the problem text ("must be ...")
def _finite(v: float) -> str | None:
    return None if math.isfinite(v) else "must be a finite number"


def positive(v):
    return _finite(v) or (None if v > 0 else "must be > 0")


def non_negative(v):
    return _finite(v) or (None if v >= 0 else "must be >= 0")


def unit_interval(v):
    return _finite(v) or (None if 0 <= v <= 1 else "must be in [0, 1]")


def bottom_scale(v):
    return _finite(v) or (None if 0 < v <= 1 else "must be in (0, 1]: block 0's LR as a fraction of the base LR")


def fraction_below_one(v):
    return _finite(v) or (None if 0 <= v < 1 else "must be in [0, 1)")


def llrd_range(v):
    if not math.isfinite(v) or not (LLRD_MIN <= v <= LLRD_MAX):
        return f"must be a number in {LLRD_RANGE} (1.0 = no decay; bare --llrd = {LLRD_BARE})"
    return None


def seed_range(v):
    return None if 0 <= v < 2**32 else "must be an integer in [0, 2**32 - 1]"


def lr_factor(item):
    pattern, factor = item
    try:
        re.compile(pattern)
    except re.error as e:
        return f"pattern {shorten(pattern, 60)!r} is not a valid regular expression ({e})"
    return (
        None
        if math.isfinite(factor) and factor >= 0
        else f"factor of {shorten(pattern, 60)!r} must be a finite number >= 0 (0 freezes)"
    )


def positive_int(v):
    return None if v > 0 else "must be a positive integer"


def steps(v):
    return None if v == -1 or v > 0 else "must be a positive integer (or -1 for 'use --epochs')"


def one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    def check(v):
        return None if v in choices else f"must be one of: {', '.join(choices)}"

    return check


# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Opt:
    """One option: its recipe key is `name`, its flag is `--name-with-dashes` (or `flag`)."""

    name: str
    type: type  # float, int, str, bool, list, dict (repeatable KEY=VALUE on the command line, a mapping in recipes)
    default: Any
    help: str
    commands: tuple[str, ...]
    check: Callable[[Any], str | None] | None = None
    metavar: str | None = None
    flag: str | None = None
    bare: Any = None  # value of the flag given without a value (e.g. `--llrd` alone → 0.95)
    required: bool = False
    recipe: bool = True  # may appear in a recipe
    panel: str = "Training"
    item: type = float  # dict options: the type of the values (float, or object = kept as given and checked later)
    key: str | None = None  # recipe key and flag name when they differ from the internal name

    @property
    def recipe_key(self) -> str:
        return self.key or self.name

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.recipe_key.replace("_", "-")


OPTIONS: tuple[Opt, ...] = (
    # what to train on
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
        "DPO reference model (default: a frozen copy of --model).",
        ("dpo",),
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
    # layer-wise LR decay
    Opt(
        "llrd",
        float,
        1.0,
        f"Layer-wise LR decay γ in {LLRD_RANGE}: block i of N trains at "
        f"lr×γ^(N-1-i). Absent: 1.0 (flat). Bare --llrd: {LLRD_BARE}.",
        POST_TRAINING,
        llrd_range,
        "[GAMMA]",
        bare=LLRD_BARE,
        panel="Layer-wise LR decay",
    ),
    Opt(
        "llrd",
        float,
        1.0,
        f"Layer-wise LR decay γ in {LLRD_RANGE} for pre-training (same rule as --llrd).",
        ("pretrain",),
        llrd_range,
        "[GAMMA]",
        bare=LLRD_BARE,
        panel="Layer-wise LR decay",
        key="lr_layer_decay",
    ),
    Opt(
        "llrd_bottom_scale",
        float,
        0.0,
        "Layer decay given by block 0's LR scale S instead of γ: γ = S^(1/(N-1)) "
        f"for the model's N blocks (γ must land in {LLRD_RANGE}). Carries one "
        "setting across depths; not with --llrd.",
        TRAINING,
        bottom_scale,
        "S",
        panel="Layer-wise LR decay",
    ),
    Opt(
        "llrd_min_scale",
        float,
        0.0,
        "Clamp: no block trains below lr×SCALE.",
        TRAINING,
        unit_interval,
        "SCALE",
        panel="Layer-wise LR decay",
    ),
    Opt(
        "llrd_freeze_below",
        float,
        0.0,
        "Freeze parameters whose LR scale is below SCALE (no optimizer state).",
        TRAINING,
        unit_interval,
        "SCALE",
        panel="Layer-wise LR decay",
    ),
    Opt(
        "llrd_blocks",
        str,
        None,
        "Dotted path of the decoder block list when it cannot be found (e.g. model.layers).",
        TRAINING,
        metavar="PATH",
        panel="Layer-wise LR decay",
    ),
    Opt(
        "lr_groups",
        dict,
        {},
        "Multiply the LR of parameters whose name matches the regex PATTERN by "
        "FACTOR, on top of their depth's scale: lr = base × γ^(N-1-i) × FACTOR "
        "(repeatable; FACTOR 0 freezes; recipe key lr_groups: a mapping).",
        TRAINING,
        lr_factor,
        "PATTERN=FACTOR",
        flag="--lr-group",
        panel="Layer-wise LR decay",
    ),
    Opt(
        "loraplus_ratio",
        float,
        1.0,
        "LoRA+: train LoRA B matrices at RATIO × their block's LR (A matrices "
        "at 1×); needs --lora-r. LoRA+ suggests 16.",
        POST_TRAINING,
        positive,
        "RATIO",
        panel="LoRA",
    ),
    Opt(
        "tied_embeddings",
        str,
        "head",
        "LR of a tied input/output embedding matrix: 'head' (base LR, the "
        "measured default) or 'embedding' (decayed like block 0).",
        TRAINING,
        one_of(TIED_POLICIES),
        "POLICY",
        panel="Layer-wise LR decay",
    ),
    # optimisation
    Opt(
        "lr",
        float,
        None,
        "Base learning rate (top block, head). Default: 2e-5 sft/finetune, 5e-7 dpo, 5e-4 pretrain.",
        TRAINING,
        positive,
        "FLOAT",
    ),
    Opt(
        "weight_decay",
        float,
        0.0,
        "AdamW weight decay (matrices only; biases and norms get 0).",
        TRAINING,
        non_negative,
        "FLOAT",
    ),
    Opt(
        "optim",
        str,
        "adamw_torch",
        "Optimizer name as in transformers (--optim); must accept parameter groups.",
        TRAINING,
        metavar="NAME",
    ),
    Opt(
        "lr_scheduler",
        str,
        "linear",
        "LR schedule (applied to every group, keeping the per-block ratios).",
        TRAINING,
        one_of(SCHEDULERS),
        "NAME",
    ),
    Opt(
        "warmup_ratio",
        float,
        0.0,
        "Fraction of steps used for linear warmup.",
        TRAINING,
        fraction_below_one,
        "FRACTION",
    ),
    Opt("max_steps", int, -1, "Number of optimizer steps (-1: train for --epochs).", TRAINING, steps, "N"),
    Opt(
        "epochs",
        float,
        1.0,
        "Number of passes over the data (ignored when --max-steps is set).",
        TRAINING,
        positive,
        "FLOAT",
    ),
    Opt("batch_size", int, 8, "Per-device batch size.", TRAINING, positive_int, "N"),
    Opt("grad_accum", int, 1, "Gradient accumulation steps.", TRAINING, positive_int, "N"),
    Opt(
        "max_length",
        int,
        None,
        "Maximum sequence length in tokens (default 512; pretrain 256).",
        TRAINING + ("eval",),
        positive_int,
        "N",
    ),
    Opt("seed", int, 42, "Random seed (0 to 2**32 - 1).", TRAINING + ("generate",), seed_range, "N"),
    Opt("beta", float, 0.1, "DPO β (strength of the KL penalty to the reference model).", ("dpo",), positive, "FLOAT"),
    Opt(
        "precision",
        str,
        "auto",
        "auto (bf16 on GPUs that support it, else fp16 on GPU, fp32 on CPU), fp32, bf16 (on CPU too: autocast, "
        "fp32 weights; fast only where the CPU has AVX512-BF16/AMX) or fp16 (GPU).",
        TRAINING,
        one_of(PRECISIONS),
        "NAME",
    ),
    Opt("gradient_checkpointing", bool, False, "Trade compute for memory.", TRAINING),
    Opt(
        "report_to",
        str,
        "none",
        "Experiment tracking: none, tensorboard, wandb, trackio or all (per-block LRs are logged as lr/block_i).",
        TRAINING,
        one_of(REPORT_TO),
        "NAME",
        panel="Run",
    ),
    Opt(
        "ddp_timeout",
        int,
        1800,
        "Seconds a distributed rank waits for the others before failing (transformers' default: 1800).",
        TRAINING,
        positive_int,
        "SECONDS",
        panel="Run",
    ),
    Opt(
        "trainer_args",
        dict,
        {},
        "Any other SFTConfig / DPOConfig / TrainingArguments field, checked "
        "against the installed version (repeatable, e.g. --trainer-arg "
        "packing=true; recipe key trainer_args: a mapping).",
        TRAINING,
        metavar="KEY=VALUE",
        flag="--trainer-arg",
        item=object,
    ),
    Opt(
        "model_args",
        dict,
        {},
        "Keyword argument for from_pretrained (repeatable, e.g. --model-arg "
        "attn_implementation=sdpa; recipe key model_args: a mapping).",
        POST_TRAINING,
        metavar="KEY=VALUE",
        flag="--model-arg",
        item=object,
        panel="Inputs",
    ),
    # LoRA
    Opt(
        "lora_r",
        int,
        None,
        "Train LoRA adapters of this rank instead of all weights (needs `pip install peft`).",
        POST_TRAINING,
        positive_int,
        "R",
        panel="LoRA",
    ),
    Opt("lora_alpha", float, None, "LoRA alpha (default 2×r).", POST_TRAINING, positive, "FLOAT", panel="LoRA"),
    Opt("lora_dropout", float, 0.0, "LoRA dropout.", POST_TRAINING, fraction_below_one, "FLOAT", panel="LoRA"),
    Opt(
        "lora_targets",
        str,
        "all-linear",
        "Comma-separated module names for LoRA (e.g. q_proj,v_proj) or all-linear.",
        POST_TRAINING,
        metavar="NAMES",
        panel="LoRA",
    ),
    # forgetting
    Opt(
        "ood_eval",
        list,
        [],
        "Text file whose perplexity is measured before and after training (repeatable).",
        POST_TRAINING,
        metavar="FILE",
        panel="Forgetting",
    ),
    Opt(
        "train_on_prompt",
        bool,
        False,
        "Put the SFT loss on every token: system and user turns and role "
        "headers of conversations, the prompt of prompt/completion rows "
        "(default: the assistant's words only).",
        ("sft",),
    ),
    Opt(
        "replay_dataset",
        str,
        None,
        "Pre-training-style text mixed into the training data against forgetting.",
        ("sft", "finetune"),
        metavar="FILE",
        panel="Forgetting",
    ),
    Opt(
        "replay_ratio",
        float,
        0.0,
        "Fraction of training rows taken from --replay-dataset.",
        ("sft", "finetune"),
        fraction_below_one,
        "FRACTION",
        panel="Forgetting",
    ),
    # run control
    Opt("save_steps", int, 200, "Save a checkpoint every N steps.", TRAINING, positive_int, "N", panel="Run"),
    Opt("save_total_limit", int, 2, "Keep at most N checkpoints.", TRAINING, positive_int, "N", panel="Run"),
    Opt("logging_steps", int, 10, "Log every N steps.", TRAINING, positive_int, "N", panel="Run"),
    Opt(
        "eval_steps",
        int,
        None,
        "Evaluate every N steps (default: at the end only).",
        TRAINING,
        positive_int,
        "N",
        panel="Run",
    ),
    Opt(
        "dry_run",
        bool,
        False,
        "Build model, data and parameter groups, print the plan, write param_groups.json; train nothing.",
        TRAINING,
        panel="Run",
    ),
    Opt(
        "overwrite", bool, False, "Allow writing into a non-empty output directory.", TRAINING + ("demo",), panel="Run"
    ),
    Opt("resume", bool, False, "Continue from the newest complete checkpoint in --output-dir.", TRAINING, panel="Run"),
    Opt(
        "allow_config_change",
        bool,
        False,
        "With --resume: accept a different LR / γ / grouping than the checkpoint's run.",
        TRAINING,
        panel="Run",
    ),
    # eval
    Opt(
        "text", list, [], "Text file to measure perplexity on (repeatable).", ("eval",), metavar="FILE", panel="Inputs"
    ),
    Opt(
        "reference",
        str,
        None,
        "Base model to compare with: adds the mean per-token KL(reference ‖ model) on each --text "
        "(a directory, .gguf file or hub id; same tokenizer).",
        ("eval",),
        metavar="PATH_OR_HUB_ID",
        panel="Inputs",
    ),
    Opt(
        "sft_dataset",
        str,
        None,
        "Instruction set whose mean completion-token loss is reported.",
        ("eval",),
        metavar="FILE",
        panel="Inputs",
    ),
    Opt("json", bool, False, "Print only a JSON object with the results.", ("eval",), panel="Run", recipe=False),
    Opt("eval_batch_size", int, 8, "Windows per forward pass.", ("eval",), positive_int, "N"),
    Opt("quick", bool, False, "Smaller demo (about a minute).", ("demo",), panel="Run"),
    # generate
    Opt("prompt", str, None, "Prompt to complete (printed to stdout).", ("generate",), metavar="TEXT", panel="Inputs"),
    Opt(
        "prompts",
        str,
        None,
        "File of prompts: one per line, or JSON Lines with prompt / messages / instruction; writes JSON Lines.",
        ("generate",),
        metavar="FILE",
        panel="Inputs",
    ),
    Opt("system", str, None, "System message put before the prompt.", ("generate",), metavar="TEXT", panel="Inputs"),
    Opt(
        "prompt_format",
        str,
        "auto",
        "auto (the chat template when the tokenizer has one, else plain), "
        "chat, alpaca (the template sft uses for Alpaca data) or plain.",
        ("generate",),
        one_of(("auto", "chat", "alpaca", "plain")),
        "FORMAT",
    ),
    Opt("max_new_tokens", int, 128, "Most tokens to generate per prompt.", ("generate",), positive_int, "N"),
    Opt("temperature", float, 0.0, "Sampling temperature (0 = greedy).", ("generate",), non_negative, "T"),
    Opt(
        "top_p",
        float,
        1.0,
        "Nucleus sampling: keep the smallest token set with this much probability.",
        ("generate",),
        unit_interval,
        "P",
    ),
    Opt(
        "output",
        str,
        None,
        "With --prompts: write the JSON Lines here instead of stdout.",
        ("generate",),
        metavar="FILE",
        panel="Run",
    ),
    # everywhere
    Opt(
        "recipe",
        str,
        None,
        "YAML recipe: keys are these option names; command-line flags override it.",
        ALL_COMMANDS[:4] + ("eval",),
        metavar="FILE",
        panel="Run",
        recipe=False,
    ),
    Opt("debug", bool, False, "Show full tracebacks.", ALL_COMMANDS, panel="Run", recipe=False),
)
RECIPE_KEYS = {o.recipe_key for o in OPTIONS}

# options whose meaning differs for one command
EVAL_MODEL = Opt(
    "model",
    str,
    None,
    "Model to evaluate: a local directory or hub id.",
    ("eval",),
    metavar="PATH_OR_HUB_ID",
    required=True,
    panel="Inputs",
)

COMMAND_DEFAULT_LR = {"sft": 2e-5, "finetune": 2e-5, "dpo": 5e-7, "pretrain": 5e-4}
COMMAND_DEFAULT_MAX_LENGTH = {"sft": 512, "dpo": 512, "finetune": 512, "pretrain": 256, "eval": 512}


DEMO_OUTPUT = Opt(
    "output_dir",
    str,
    "demo-output",
    "Directory for the demo's data, models and results.",
    ("demo",),
    metavar="DIR",
    panel="Inputs",
)
GENERATE_MODEL = Opt(
    "model",
    str,
    None,
    "Model to generate with: a local directory or hub id.",
    ("generate",),
    metavar="PATH_OR_HUB_ID",
    required=True,
    panel="Inputs",
)
EXTRA_OPTIONS = {"eval": EVAL_MODEL, "demo": DEMO_OUTPUT, "generate": GENERATE_MODEL}


def options_for(command: str) -> list[Opt]:
    opts = [o for o in OPTIONS if command in o.commands]
    if command in EXTRA_OPTIONS:
        opts.insert(0, EXTRA_OPTIONS[command])
    return opts


# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunConfig:
    """The resolved configuration of one command run: one typed field per option of the table (a test checks that
    the two match), None for options the command does not have; plus where each value came from and the command
    line as given. Frozen: a step that changes a value makes a new config (`dataclasses.replace`)."""

    command: str
    sources: dict[str, str] = field(default_factory=dict)  # option name -> "default" | "recipe" | "cli"
    argv: list[str] = field(default_factory=list)  # the command line as given: COMMAND OPTIONS...
    # inputs
    model: str | None = None
    dataset: str | None = None
    output_dir: str | None = None
    eval_dataset: str | None = None
    eval_split: float | None = None
    max_samples: int | None = None
    streaming: bool | None = None
    dataset_num_proc: int | None = None
    ref_model: str | None = None
    model_config: str | None = None
    vocab_size: int | None = None
    trust_remote_code: bool | None = None
    model_args: dict[str, Any] | None = None
    # layer-wise LR decay and LR factors
    llrd: float | None = None
    llrd_bottom_scale: float | None = None
    llrd_min_scale: float | None = None
    llrd_freeze_below: float | None = None
    llrd_blocks: str | None = None
    lr_groups: dict[str, float] | None = None
    tied_embeddings: str | None = None
    # optimisation
    lr: float | None = None
    weight_decay: float | None = None
    optim: str | None = None
    lr_scheduler: str | None = None
    warmup_ratio: float | None = None
    max_steps: int | None = None
    epochs: float | None = None
    batch_size: int | None = None
    grad_accum: int | None = None
    max_length: int | None = None
    seed: int | None = None
    beta: float | None = None
    precision: str | None = None
    gradient_checkpointing: bool | None = None
    report_to: str | None = None
    ddp_timeout: int | None = None
    trainer_args: dict[str, Any] | None = None
    # LoRA
    lora_r: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    lora_targets: str | None = None
    loraplus_ratio: float | None = None
    # forgetting
    ood_eval: list[str] | None = None
    train_on_prompt: bool | None = None
    replay_dataset: str | None = None
    replay_ratio: float | None = None
    # run control
    save_steps: int | None = None
    save_total_limit: int | None = None
    logging_steps: int | None = None
    eval_steps: int | None = None
    dry_run: bool | None = None
    overwrite: bool | None = None
    resume: bool | None = None
    allow_config_change: bool | None = None
    recipe: str | None = None
    debug: bool | None = None
    # eval
    text: list[str] | None = None
    reference: str | None = None
    sft_dataset: str | None = None
    json: bool | None = None
    eval_batch_size: int | None = None
    # generate
    prompt: str | None = None
    prompts: str | None = None
    system: str | None = None
    prompt_format: str | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    output: str | None = None
    # demo
    quick: bool | None = None

    def option_names(self) -> list[str]:
        return [o.name for o in options_for(self.command)]

    def to_dict(self) -> dict[str, Any]:
        """The command's options (not the run switches) for run_config.json and resume comparisons."""
        skip = {"debug", "json", "recipe", "dry_run", "overwrite", "resume", "allow_config_change"}
        return {"command": self.command, **{k: getattr(self, k) for k in self.option_names() if k not in skip}}


def _coerce(opt: Opt, raw: Any, origin: str) -> tuple[Any, str | None]:
    """Turn a CLI string or a YAML value into the option's type. Returns (value, problem)."""
    where = f"{opt.cli_flag}" if origin == "cli" else f"recipe key '{opt.recipe_key}'"
    if raw is None:
        return None, None
    t = opt.type
    try:
        if t is bool:
            if isinstance(raw, bool):
                return raw, None
            if isinstance(raw, str) and raw.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
                return raw.lower() in ("true", "yes", "1", "on"), None
            raise ValueError
        if t is dict:  # KEY=VALUE entries (command line) or a mapping (recipe)
            items = list(raw.items()) if isinstance(raw, dict) else raw if isinstance(raw, (list, tuple)) else [raw]
            out = {}
            for item in items:
                if isinstance(item, tuple):
                    key, value = item
                elif isinstance(item, str) and "=" in item:  # a pattern may hold "=", a factor never; a value may
                    key, value = item.rsplit("=", 1) if opt.item is float else item.split("=", 1)
                else:
                    raise ValueError
                if not isinstance(key, str) or not key.strip():
                    raise ValueError
                if opt.item is float:
                    if isinstance(value, (bool, dict, list)):
                        raise ValueError
                    value = float(value)
                out[key.strip() if opt.item is not float else key] = value
            return out, None
        if t is list:
            if isinstance(raw, (list, tuple)):
                if not all(isinstance(x, (str, int, float)) for x in raw):
                    raise ValueError
                return [str(x) for x in raw], None
            if isinstance(raw, str):
                return [raw], None
            raise ValueError
        if t is int:
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, float) and raw.is_integer():
                return int(raw), None
            if isinstance(raw, int):
                return raw, None
            return int(str(raw).strip()), None
        if t is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw), None
        if t is str:
            if isinstance(raw, (dict, list, tuple)):
                raise ValueError
            return str(raw), None
    except (TypeError, ValueError):
        pass
    kind = {
        bool: "true/false",
        list: "a list of strings",
        int: "an integer",
        float: "a number",
        str: "a string",
        dict: f"{opt.metavar} entries (a mapping in recipes)",
    }[t]
    extra = f" {LLRD_RANGE}" if opt.check is llrd_range else ""
    return None, f"{where}: expected {kind}{extra}, got {quote(raw)}"


_QUOTE = reprlib.Repr()
_QUOTE.maxstring, _QUOTE.maxother, _QUOTE.maxlevel = 60, 60, 3
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = _QUOTE.maxset = 4


def quote(value: Any, limit: int = 80) -> str:
    """A short repr for error messages: a value of any size (an 80 MB string, a huge list) quotes at most a prefix."""
    text = _QUOTE.repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def special_file(path: str) -> str | None:
    """What a path is when it exists but is neither a regular file nor a directory (reading it could block forever
    or never end), else None. Checked before anything opens it."""
    try:
        mode = os.stat(os.path.expanduser(path)).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kinds = (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


RECIPE_MAX_BYTES = 1 << 20  # recipes are a few hundred bytes; a bound keeps a hostile file from costing memory
RECIPE_MAX_NODES = 10_000  # values after YAML aliases are expanded (a flat recipe has a few dozen)


def _expanded_nodes(root, cap: int = RECIPE_MAX_NODES) -> int:
    """How many nodes the YAML document holds once every alias is expanded, computed on the node graph (shared
    nodes counted once per use, in linear time, without expanding anything). Recursive aliases count as > cap."""
    import yaml

    size: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            if isinstance(node, yaml.SequenceNode):
                kids = node.value
            elif isinstance(node, yaml.MappingNode):
                kids = [x for pair in node.value for x in pair]
            else:
                kids = []
            size[key] = min(cap + 1, 1 + sum(size[id(k)] for k in kids))
            continue
        if key in size:
            continue
        if key in on_path:
            return cap + 1  # an alias to an enclosing node: infinite when expanded
        on_path.add(key)
        stack.append((node, True))
        if isinstance(node, yaml.SequenceNode):
            kids = node.value
        elif isinstance(node, yaml.MappingNode):
            kids = [x for pair in node.value for x in pair]
        else:
            kids = []
        for kid in kids:
            if id(kid) in on_path:
                return cap + 1
            if id(kid) not in size:
                stack.append((kid, False))
    return size[id(root)]


def load_recipe(path: str) -> dict[str, Any]:
    """Read a YAML recipe into a flat dict; problems are UsageErrors (exit 2).

    Bounded on hostile input: only regular files, at most RECIPE_MAX_BYTES, and at most RECIPE_MAX_NODES values
    once YAML aliases are expanded (a 400-byte "billion laughs" is refused before anything is expanded)."""
    import yaml

    p = Path(path).expanduser()
    shown = shorten(path)
    if not p.exists():
        raise UsageError(f"recipe not found: {shown}")
    if p.is_dir():
        raise UsageError(f"recipe {shown} is a directory; pass a .yaml file")
    kind = special_file(path)
    if kind:
        raise UsageError(f"recipe {shown} is {kind}, not a regular file; pass a .yaml file")
    try:
        with open(p, "rb") as fh:
            raw = fh.read(RECIPE_MAX_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read recipe {shown}: {e.strerror or e}") from None
    if len(raw) > RECIPE_MAX_BYTES:
        raise UsageError(
            f"recipe {shown} is larger than {RECIPE_MAX_BYTES // 1024} KiB; a "
            "recipe is a short list of option: value lines"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"recipe {shown} is not UTF-8 text (byte {e.start})") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_nodes(node) > RECIPE_MAX_NODES:
            raise UsageError(
                f"recipe {shown} holds more than {RECIPE_MAX_NODES} values once its "
                "YAML aliases (*name) are expanded; a recipe is a flat list of option: "
                "value lines"
            )
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise UsageError(f"recipe {shown}{line}: invalid YAML ({shorten(problem)})") from None
    except RecursionError:
        raise UsageError(
            f"recipe {shown} is nested too deeply; a recipe is a flat list of option: value lines"
        ) from None
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"recipe {shown} must be a mapping of option names to values (got {type(data).__name__})")
    out = {}
    for k, v in data.items():
        if not isinstance(k, (str, int, float, bool)):
            raise UsageError(f"recipe {shown}: keys must be option names, got {quote(k)}")
        out[str(k).replace("-", "_")] = v
    return out


def resolve(command: str, cli_values: dict[str, Any], argv: list[str] | None = None) -> RunConfig:
    """defaults < recipe < command line; validate everything; raise ConfigErrors listing all problems."""
    opts = {o.name: o for o in options_for(command)}
    by_key = {o.recipe_key: o for o in opts.values()}
    problems: list[str] = []
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, o in opts.items():
        values[name] = type(o.default)(o.default) if isinstance(o.default, (list, dict)) else o.default
        sources[name] = "default"

    recipe_path = cli_values.get("recipe")
    if recipe_path:
        recipe = load_recipe(recipe_path)
        valid = sorted(o.recipe_key for o in opts.values() if o.recipe)
        for key, raw in recipe.items():
            o = by_key.get(key)
            if o is None or not o.recipe:
                hint = " (it belongs to another command)" if key in RECIPE_KEYS else ""
                problems.append(f"recipe {shorten(recipe_path)}: unknown key '{shorten(key, 60)}'{hint}")
                continue
            v, problem = _coerce(o, raw, "recipe")
            if problem:
                problems.append(f"recipe {shorten(recipe_path)}: {problem}")
                continue
            values[o.name], sources[o.name] = v, "recipe"
        if any("unknown key" in p for p in problems):
            problems.append(f"valid recipe keys for '{command}': {', '.join(valid)}")

    for key, raw in cli_values.items():
        if raw is None or key not in opts:
            continue
        if opts[key].type in (list, dict) and raw == []:
            continue
        v, problem = _coerce(opts[key], raw, "cli")
        if problem:
            problems.append(problem)
            continue
        values[key], sources[key] = v, "cli"

    for name, o in opts.items():
        v = values.get(name)
        if v is None:
            if o.required:
                problems.append(f"missing {o.cli_flag} (or recipe key '{o.recipe_key}')")
            continue
        if o.check is not None and sources[name] != "default":
            items = v if isinstance(v, list) else list(v.items()) if isinstance(v, dict) else [v]
            for item in items:
                problem = o.check(item)
                if problem:
                    where = o.cli_flag if sources[name] == "cli" else f"recipe key '{o.recipe_key}'"
                    problems.append(f"{where} {problem}, got {quote(item)}")

    if command in COMMAND_DEFAULT_LR and values.get("lr") is None:
        values["lr"] = COMMAND_DEFAULT_LR[command]
    if (
        command in TRAINING
        and not values.get("output_dir")
        and values.get("model" if command != "pretrain" else "dataset")
    ):
        values["output_dir"] = default_output_dir(command, values["model" if command != "pretrain" else "dataset"])
    if "max_length" in values and values.get("max_length") is None:
        values["max_length"] = COMMAND_DEFAULT_MAX_LENGTH[command]
    problems += _cross_checks(command, values)
    if problems:
        raise ConfigErrors(problems)
    return RunConfig(command=command, sources=sources, argv=list(argv or [command]), **values)


def default_output_dir(command: str, source: str) -> str:
    """runs/sft-Qwen2.5-0.5B for `sft --model Qwen/Qwen2.5-0.5B`; runs/pretrain-corpus for `pretrain --dataset
    corpus.txt`."""
    name = Path(source.rstrip("/\\")).name or "model"
    if command == "pretrain":
        name = Path(name).stem
    return str(Path("runs") / f"{command}-{name}")


def _cross_checks(command: str, v: dict[str, Any]) -> list[str]:
    problems = []
    if v.get("resume") and v.get("overwrite"):
        problems.append("--resume and --overwrite contradict each other: pick one")
    if v.get("llrd_bottom_scale") and v.get("llrd", 1.0) != 1.0:
        problems.append(
            "--llrd and --llrd-bottom-scale both set the layer decay: give one (the bottom scale S means "
            "γ = S^(1/(N-1)))"
        )
    if v.get("llrd_min_scale") and v.get("llrd_freeze_below") and v["llrd_freeze_below"] > v["llrd_min_scale"] > 0:
        problems.append(
            "--llrd-freeze-below is above --llrd-min-scale: with the clamp nothing is below it; set one of them"
        )
    if v.get("replay_ratio") and not v.get("replay_dataset"):
        problems.append("--replay-ratio needs --replay-dataset")
    if v.get("replay_dataset") and not v.get("replay_ratio"):
        problems.append("--replay-dataset needs --replay-ratio > 0")
    if v.get("eval_dataset") and v.get("eval_split"):
        problems.append("give either --eval-dataset or --eval-split, not both")
    if v.get("streaming") and (v.get("max_steps") or -1) <= 0:
        problems.append("--streaming needs --max-steps N: a stream has no length, so --epochs cannot tell when to stop")
    for key in ("lora_alpha", "lora_dropout"):
        if v.get(key) and not v.get("lora_r"):
            problems.append(f"--{key.replace('_', '-')} needs --lora-r")
    if v.get("loraplus_ratio", 1.0) != 1.0 and not v.get("lora_r"):
        problems.append("--loraplus-ratio needs --lora-r (LoRA+ scales the LoRA B matrices)")
    if command == "generate" and (v.get("prompt") is None) == (v.get("prompts") is None):
        problems.append("give either --prompt TEXT or --prompts FILE (one of them)")
    if command == "generate" and v.get("output") and v.get("prompt") is not None:
        problems.append("--output goes with --prompts FILE (a single --prompt is printed)")
    if command == "generate" and v.get("prompts") and not os.path.isfile(os.path.expanduser(v["prompts"])):
        problems.append(f"--prompts: {v['prompts']} does not exist")
    if command == "eval" and not v.get("text") and not v.get("sft_dataset"):
        problems.append("nothing to evaluate: give --text FILE (repeatable) and/or --sft-dataset FILE")
    for key in ("dataset", "eval_dataset", "replay_dataset", "sft_dataset", "ref_model", "model", "reference"):
        path = v.get(key)
        if path and looks_local(path) and not os.path.exists(os.path.expanduser(path)):
            problems.append(f"--{key.replace('_', '-')}: {shorten(path)} does not exist")
    # inputs that are read: a FIFO, socket or device would block forever or never end, so refuse before opening
    named = [(k, v.get(k)) for k in ("dataset", "eval_dataset", "replay_dataset", "sft_dataset", "model_config")]
    named += [("ood_eval", p) for p in v.get("ood_eval") or []] + [("text", p) for p in v.get("text") or []]
    for key, path in named:
        kind = special_file(path) if isinstance(path, str) and path else None
        if kind:
            problems.append(f"--{key.replace('_', '-')} {shorten(path)} is {kind}, not a regular file: pass a file")
    for path in list(v.get("ood_eval") or []) + list(v.get("text") or []):
        if not special_file(path) and not os.path.isfile(os.path.expanduser(path)):
            problems.append(f"text file not found: {shorten(path)}")
    return problems


def producing_recipe(recipe: str | None, ref: str) -> str | None:
    """When `ref` (e.g. runs/shakespeare-base) is the output_dir of a recipe beside `recipe` (or in ./recipes),
    a hint naming the command that produces it."""
    dirs = []
    if recipe:
        dirs.append(Path(recipe).expanduser().parent)
    dirs.append(Path("recipes"))
    want = os.path.normpath(ref.rstrip("/"))
    seen = set()
    for d in dirs:
        if not d.is_dir() or d.resolve() in seen:
            continue
        seen.add(d.resolve())
        for f in sorted(d.glob("*.y*ml")):
            try:
                data = load_recipe(str(f))
            except UsageError:
                continue
            if isinstance(data.get("output_dir"), str) and os.path.normpath(data["output_dir"].rstrip("/")) == want:
                first = f.read_text(encoding="utf-8", errors="replace").splitlines()[:1]
                command = (
                    first[0][2:].strip()
                    if first and first[0].startswith("# posttrainllm ")
                    else f"posttrainllm ... --recipe {f}"
                )
                return f"{ref} is what recipe {f} produces: run `{command}` first, or pass --model"
    return None
