"""The run configuration: one table of options, recipes, and validation.

Config flows one way: defaults < recipe (YAML, flat keys = option names) < command line.
Every problem (unknown recipe key, wrong type, value out of range) is collected and reported at once,
before any model or data is loaded. This module imports no torch/transformers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from posttrainllm.errors import ConfigErrors, UsageError

TRAIN_COMMANDS = ("sft", "dpo", "finetune")
ALL_COMMANDS = ("pretrain", "sft", "dpo", "finetune", "eval", "demo")

LLRD_MIN, LLRD_MAX = 0.5, 1.0
LLRD_BARE = 0.95  # value of a bare `--llrd` (no number)
LLRD_RANGE = f"[{LLRD_MIN}, {LLRD_MAX}]"

SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr", "warmup_stable_decay")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
TIED_POLICIES = ("embedding", "head")  # mirrors posttrainllm.llrd.TIED_POLICIES (kept here to stay torch-free)


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


def fraction_below_one(v):
    return _finite(v) or (None if 0 <= v < 1 else "must be in [0, 1)")


def llrd_range(v):
    if not math.isfinite(v) or not (LLRD_MIN <= v <= LLRD_MAX):
        return f"must be a number in {LLRD_RANGE} (1.0 = no decay; bare --llrd = {LLRD_BARE})"
    return None


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
    type: type  # float, int, str, bool, list
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

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


TR = TRAIN_COMMANDS
TRP = TRAIN_COMMANDS + ("pretrain",)

OPTIONS: tuple[Opt, ...] = (
    # what to train on
    Opt("model", str, None, "Model to start from: a local directory or a Hugging Face hub id.", TR, metavar="PATH_OR_HUB_ID", required=True, panel="Inputs"),
    Opt("dataset", str, None, "Training data: a local file (.json .jsonl .csv .parquet .txt) or a hub dataset id.", TRP, metavar="PATH_OR_HUB_ID", required=True, panel="Inputs"),
    Opt("output_dir", str, None, "Directory for the trained model, checkpoints and run records (default: runs/COMMAND-NAME, NAME from --model, or --dataset for pretrain).", TRP, metavar="DIR", panel="Inputs"),
    Opt("eval_dataset", str, None, "Separate validation data (same shape as --dataset).", TRP, metavar="PATH_OR_HUB_ID", panel="Inputs"),
    Opt("eval_split", float, 0.0, "Fraction of --dataset held out for validation (0 = none).", TRP, fraction_below_one, "FRACTION", panel="Inputs"),
    Opt("max_samples", int, None, "Use at most this many training examples.", TRP, positive_int, "N", panel="Inputs"),
    Opt("streaming", bool, False, "Read --dataset (and --replay-dataset) as a stream, converted as training reads it: for corpora bigger than RAM or disk. Needs --max-steps; --eval-split takes the eval rows from the head of the stream.", TRP, panel="Inputs"),
    Opt("dataset_num_proc", int, 1, "Processes for converting and tokenizing the data (datasets' num_proc, also used for TRL's tokenization).", TRP, positive_int, "N", panel="Inputs"),
    Opt("ref_model", str, None, "DPO reference model (default: a frozen copy of --model).", ("dpo",), metavar="PATH_OR_HUB_ID", panel="Inputs"),
    Opt("model_config", str, "small", "Preset (tiny, small, base) or a config.json path for the from-scratch model.", ("pretrain",), metavar="PRESET_OR_PATH", panel="Inputs"),
    Opt("vocab_size", int, 4096, "Vocabulary size of the byte-level BPE tokenizer trained on the corpus.", ("pretrain",), positive_int, "N", panel="Inputs"),
    Opt("trust_remote_code", bool, False, "Allow model repositories to run their own Python code (off by default).", TR + ("eval",), panel="Inputs"),
    # layer-wise LR decay
    Opt("llrd", float, 1.0, f"Layer-wise LR decay γ in {LLRD_RANGE}: block i of N trains at lr×γ^(N-1-i). Absent: 1.0 (flat). Bare --llrd: {LLRD_BARE}.", TR, llrd_range, "[GAMMA]", bare=LLRD_BARE, panel="Layer-wise LR decay"),
    Opt("lr_layer_decay", float, 1.0, f"Layer-wise LR decay γ in {LLRD_RANGE} for pre-training (same rule as --llrd).", ("pretrain",), llrd_range, "[GAMMA]", bare=LLRD_BARE, panel="Layer-wise LR decay"),
    Opt("llrd_min_scale", float, 0.0, "Clamp: no block trains below lr×SCALE.", TRP, unit_interval, "SCALE", panel="Layer-wise LR decay"),
    Opt("llrd_freeze_below", float, 0.0, "Freeze parameters whose LR scale is below SCALE (no optimizer state).", TRP, unit_interval, "SCALE", panel="Layer-wise LR decay"),
    Opt("llrd_blocks", str, None, "Dotted path of the decoder block list when it cannot be found (e.g. model.layers).", TRP, metavar="PATH", panel="Layer-wise LR decay"),
    Opt("tied_embeddings", str, "head", "LR of a tied input/output embedding matrix: 'head' (base LR, the measured default) or 'embedding' (decayed like block 0).", TRP, one_of(TIED_POLICIES), "POLICY", panel="Layer-wise LR decay"),
    # optimisation
    Opt("lr", float, None, "Base learning rate (top block, head). Default: 2e-5 sft/finetune, 5e-7 dpo, 5e-4 pretrain.", TRP, positive, "FLOAT"),
    Opt("weight_decay", float, 0.0, "AdamW weight decay (matrices only; biases and norms get 0).", TRP, non_negative, "FLOAT"),
    Opt("optim", str, "adamw_torch", "Optimizer name as in transformers (--optim); must accept parameter groups.", TRP, metavar="NAME"),
    Opt("lr_scheduler", str, "linear", "LR schedule (applied to every group, keeping the per-block ratios).", TRP, one_of(SCHEDULERS), "NAME"),
    Opt("warmup_ratio", float, 0.0, "Fraction of steps used for linear warmup.", TRP, fraction_below_one, "FRACTION"),
    Opt("max_steps", int, -1, "Number of optimizer steps (-1: train for --epochs).", TRP, steps, "N"),
    Opt("epochs", float, 1.0, "Number of passes over the data (ignored when --max-steps is set).", TRP, positive, "FLOAT"),
    Opt("batch_size", int, 8, "Per-device batch size.", TRP, positive_int, "N"),
    Opt("grad_accum", int, 1, "Gradient accumulation steps.", TRP, positive_int, "N"),
    Opt("max_length", int, None, "Maximum sequence length in tokens (default 512; pretrain 256).", TRP + ("eval",), positive_int, "N"),
    Opt("seed", int, 42, "Random seed.", TRP, None, "N"),
    Opt("beta", float, 0.1, "DPO β (strength of the KL penalty to the reference model).", ("dpo",), positive, "FLOAT"),
    Opt("precision", str, "auto", "auto (bf16 on GPUs that support it, else fp16 on GPU, fp32 on CPU), fp32, bf16 or fp16.", TRP, one_of(PRECISIONS), "NAME"),
    Opt("gradient_checkpointing", bool, False, "Trade compute for memory.", TRP),
    # LoRA
    Opt("lora_r", int, None, "Train LoRA adapters of this rank instead of all weights (needs `pip install peft`).", TR, positive_int, "R", panel="LoRA"),
    Opt("lora_alpha", float, None, "LoRA alpha (default 2×r).", TR, positive, "FLOAT", panel="LoRA"),
    Opt("lora_dropout", float, 0.0, "LoRA dropout.", TR, fraction_below_one, "FLOAT", panel="LoRA"),
    Opt("lora_targets", str, "all-linear", "Comma-separated module names for LoRA (e.g. q_proj,v_proj) or all-linear.", TR, metavar="NAMES", panel="LoRA"),
    # forgetting
    Opt("ood_eval", list, [], "Text file whose perplexity is measured before and after training (repeatable).", TR, metavar="FILE", panel="Forgetting"),
    Opt("train_on_prompt", bool, False, "Put the SFT loss on every token: system and user turns and role headers of conversations, the prompt of prompt/completion rows (default: the assistant's words only).", ("sft",)),
    Opt("replay_dataset", str, None, "Pre-training-style text mixed into the training data against forgetting.", ("sft", "finetune"), metavar="FILE", panel="Forgetting"),
    Opt("replay_ratio", float, 0.0, "Fraction of training rows taken from --replay-dataset.", ("sft", "finetune"), fraction_below_one, "FRACTION", panel="Forgetting"),
    # run control
    Opt("save_steps", int, 200, "Save a checkpoint every N steps.", TRP, positive_int, "N", panel="Run"),
    Opt("save_total_limit", int, 2, "Keep at most N checkpoints.", TRP, positive_int, "N", panel="Run"),
    Opt("logging_steps", int, 10, "Log every N steps.", TRP, positive_int, "N", panel="Run"),
    Opt("eval_steps", int, None, "Evaluate every N steps (default: at the end only).", TRP, positive_int, "N", panel="Run"),
    Opt("dry_run", bool, False, "Build model, data and parameter groups, print the plan, write param_groups.json; train nothing.", TRP, panel="Run"),
    Opt("overwrite", bool, False, "Allow writing into a non-empty output directory.", TRP + ("demo",), panel="Run"),
    Opt("resume", bool, False, "Continue from the newest complete checkpoint in --output-dir.", TRP, panel="Run"),
    Opt("allow_config_change", bool, False, "With --resume: accept a different LR / γ / grouping than the checkpoint's run.", TRP, panel="Run"),
    # eval
    Opt("text", list, [], "Text file to measure perplexity on (repeatable).", ("eval",), metavar="FILE", panel="Inputs"),
    Opt("sft_dataset", str, None, "Instruction set whose mean completion-token loss is reported.", ("eval",), metavar="FILE", panel="Inputs"),
    Opt("json", bool, False, "Print only a JSON object with the results.", ("eval",), panel="Run", recipe=False),
    Opt("eval_batch_size", int, 8, "Windows per forward pass.", ("eval",), positive_int, "N"),
    Opt("quick", bool, False, "Smaller demo (about a minute).", ("demo",), panel="Run"),
    # everywhere
    Opt("recipe", str, None, "YAML recipe: keys are these option names; command-line flags override it.", ALL_COMMANDS[:4] + ("eval",), metavar="FILE", panel="Run", recipe=False),
    Opt("debug", bool, False, "Show full tracebacks.", ALL_COMMANDS, panel="Run", recipe=False),
)
OPTION_BY_NAME = {o.name: o for o in OPTIONS}

# options whose meaning differs for one command
EVAL_MODEL = Opt("model", str, None, "Model to evaluate: a local directory or hub id.", ("eval",), metavar="PATH_OR_HUB_ID", required=True, panel="Inputs")

COMMAND_DEFAULT_LR = {"sft": 2e-5, "finetune": 2e-5, "dpo": 5e-7, "pretrain": 5e-4}
COMMAND_DEFAULT_MAX_LENGTH = {"sft": 512, "dpo": 512, "finetune": 512, "pretrain": 256, "eval": 512}


DEMO_OUTPUT = Opt("output_dir", str, "demo-output", "Directory for the demo's data, models and results.", ("demo",), metavar="DIR", panel="Inputs")
EXTRA_OPTIONS = {"eval": EVAL_MODEL, "demo": DEMO_OUTPUT}


def options_for(command: str) -> list[Opt]:
    opts = [o for o in OPTIONS if command in o.commands]
    if command in EXTRA_OPTIONS:
        opts.insert(0, EXTRA_OPTIONS[command])
    return opts


# ----------------------------------------------------------------------------------------------------------------
@dataclass
class RunConfig:
    """The resolved configuration of one command run (attribute access, plus where each value came from)."""

    command: str
    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)  # name -> "default" | "recipe" | "cli"

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict[str, Any]:
        skip = {"debug", "json", "recipe", "dry_run", "overwrite", "resume", "allow_config_change"}
        return {"command": self.command, **{k: v for k, v in self.values.items() if k not in skip}}

    @property
    def gamma(self) -> float:
        return self.values.get("llrd", self.values.get("lr_layer_decay", 1.0))


def _coerce(opt: Opt, raw: Any, origin: str) -> tuple[Any, str | None]:
    """Turn a CLI string or a YAML value into the option's type. Returns (value, problem)."""
    where = f"{opt.cli_flag}" if origin == "cli" else f"recipe key '{opt.name}'"
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
    kind = {bool: "true/false", list: "a list of strings", int: "an integer", float: "a number", str: "a string"}[t]
    extra = f" {LLRD_RANGE}" if opt.check is llrd_range else ""
    return None, f"{where}: expected {kind}{extra}, got {raw!r}"


def load_recipe(path: str) -> dict[str, Any]:
    """Read a YAML recipe into a flat dict; problems are UsageErrors (exit 2)."""
    import yaml

    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"recipe not found: {path}")
    if p.is_dir():
        raise UsageError(f"recipe {path} is a directory; pass a .yaml file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read recipe {path}: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"recipe {path}{line}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"recipe {path} must be a mapping of option names to values (got {type(data).__name__})")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def resolve(command: str, cli_values: dict[str, Any]) -> RunConfig:
    """defaults < recipe < command line; validate everything; raise ConfigErrors listing all problems."""
    opts = {o.name: o for o in options_for(command)}
    problems: list[str] = []
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, o in opts.items():
        values[name] = list(o.default) if isinstance(o.default, list) else o.default
        sources[name] = "default"

    recipe_path = cli_values.get("recipe")
    if recipe_path:
        recipe = load_recipe(recipe_path)
        valid = sorted(n for n, o in opts.items() if o.recipe)
        for key, raw in recipe.items():
            o = opts.get(key)
            if o is None or not o.recipe:
                hint = " (it belongs to another command)" if key in OPTION_BY_NAME else ""
                problems.append(f"recipe {recipe_path}: unknown key '{key}'{hint}")
                continue
            v, problem = _coerce(o, raw, "recipe")
            if problem:
                problems.append(f"recipe {recipe_path}: {problem}")
                continue
            values[key], sources[key] = v, "recipe"
        if any("unknown key" in p for p in problems):
            problems.append(f"valid recipe keys for '{command}': {', '.join(valid)}")

    for key, raw in cli_values.items():
        if raw is None or key not in opts:
            continue
        if opts[key].type is list and raw == []:
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
                problems.append(f"missing {o.cli_flag} (or recipe key '{name}')")
            continue
        if o.check is not None and sources[name] != "default":
            items = v if isinstance(v, list) else [v]
            for item in items:
                problem = o.check(item)
                if problem:
                    where = o.cli_flag if sources[name] == "cli" else f"recipe key '{name}'"
                    problems.append(f"{where} {problem}, got {item!r}")

    if command in COMMAND_DEFAULT_LR and values.get("lr") is None:
        values["lr"] = COMMAND_DEFAULT_LR[command]
    if command in TRP and not values.get("output_dir") and values.get("model" if command != "pretrain" else "dataset"):
        values["output_dir"] = default_output_dir(command, values["model" if command != "pretrain" else "dataset"])
    if "max_length" in values and values.get("max_length") is None:
        values["max_length"] = COMMAND_DEFAULT_MAX_LENGTH[command]
    problems += _cross_checks(command, values)
    if problems:
        raise ConfigErrors(problems)
    return RunConfig(command, values, sources)


def default_output_dir(command: str, source: str) -> str:
    """runs/sft-Qwen2.5-0.5B for `sft --model Qwen/Qwen2.5-0.5B`; runs/pretrain-corpus for `pretrain --dataset corpus.txt`."""
    name = Path(source.rstrip("/\\")).name or "model"
    if command == "pretrain":
        name = Path(name).stem
    return str(Path("runs") / f"{command}-{name}")


def _cross_checks(command: str, v: dict[str, Any]) -> list[str]:
    problems = []
    if v.get("resume") and v.get("overwrite"):
        problems.append("--resume and --overwrite contradict each other: pick one")
    if v.get("llrd_min_scale") and v.get("llrd_freeze_below") and v["llrd_freeze_below"] > v["llrd_min_scale"] > 0:
        problems.append("--llrd-freeze-below is above --llrd-min-scale: with the clamp nothing is below it; set one of them")
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
    if command == "eval" and not v.get("text") and not v.get("sft_dataset"):
        problems.append("nothing to evaluate: give --text FILE (repeatable) and/or --sft-dataset FILE")
    for key in ("dataset", "eval_dataset", "replay_dataset", "sft_dataset", "ref_model", "model"):
        path = v.get(key)
        if path and _looks_local(path) and not os.path.exists(os.path.expanduser(path)):
            problems.append(f"--{key.replace('_', '-')}: {path} does not exist")
    for path in list(v.get("ood_eval") or []) + list(v.get("text") or []):
        if not os.path.isfile(os.path.expanduser(path)):
            problems.append(f"text file not found: {path}")
    return problems


def _looks_local(ref: str) -> bool:
    """A path the user means as local (not a hub id like 'owner/name')."""
    if os.path.exists(os.path.expanduser(ref)):
        return True
    if ref.startswith((".", "/", "~")) or "\\" in ref or ref.count("/") > 1:
        return True
    return Path(ref).suffix.lower() in (".json", ".jsonl", ".csv", ".parquet", ".txt", ".yaml", ".yml", ".safetensors", ".bin")
