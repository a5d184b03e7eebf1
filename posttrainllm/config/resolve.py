"""resolve: defaults < recipe < command line → one typed, validated RunConfig; every problem reported at once,
before any model or data is loaded. Imports no torch/transformers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from posttrainllm.config.checks import ONLINE_RL, TRAINING
from posttrainllm.config.coerce import option_value, quote
from posttrainllm.config.opt import Opt
from posttrainllm.config.options import (
    COMMAND_DEFAULT_LR,
    COMMAND_DEFAULT_MAX_LENGTH,
    COMMAND_DEFAULTS,
    RECIPE_KEYS,
    options_for,
)
from posttrainllm.config.recipe import load_recipe
from posttrainllm.config.runconfig import RunConfig
from posttrainllm.errors import ConfigErrors, shorten
from posttrainllm.refs import looks_local, special_file


def _defaults(opts: dict[str, Opt]) -> tuple[dict[str, Any], dict[str, str]]:
    values = {
        n: type(o.default)(o.default) if isinstance(o.default, (list, dict)) else o.default for n, o in opts.items()
    }
    return values, dict.fromkeys(opts, "default")


def _apply_recipe(command: str, path: str, opts: dict[str, Opt], values: dict, sources: dict) -> list[str]:
    """The recipe's values into `values` (source "recipe"); its problems."""
    by_key = {o.recipe_key: o for o in opts.values()}
    by_key.update({k: o for o in opts.values() for k in o.deprecated})
    problems: list[str] = []
    unknown = False
    for key, raw in load_recipe(path).items():
        o = by_key.get(key)
        if o is None or not o.recipe:
            hint = " (it belongs to another command)" if key in RECIPE_KEYS else ""
            problems.append(f"recipe {shorten(path)}: unknown key '{shorten(key, 60)}'{hint}")
            unknown = True
            continue
        v, problem = option_value(o, raw, "recipe")
        if problem:
            problems.append(f"recipe {shorten(path)}: {problem}")
            continue
        values[o.name], sources[o.name] = v, "recipe"
    if unknown:
        valid = sorted(o.recipe_key for o in opts.values() if o.recipe)
        problems.append(f"valid recipe keys for '{command}': {', '.join(valid)}")
    return problems


def _apply_cli(cli_values: dict[str, Any], opts: dict[str, Opt], values: dict, sources: dict) -> list[str]:
    problems = []
    for key, raw in cli_values.items():
        if raw is None or key not in opts or (opts[key].type in (list, dict) and raw == []):
            continue
        v, problem = option_value(opts[key], raw, "cli")
        if problem:
            problems.append(problem)
            continue
        values[key], sources[key] = v, "cli"
    return problems


def _recipe_code(recipe: str | None, values: dict, sources: dict) -> list[str]:
    """A recipe's reward_fn names Python code to import: it runs only with --trust-reward-code on the command line (a
    recipe cannot set that flag), and never silently, not even under --dry-run (docs/decision_log.md, "Reward code
    named by a recipe")."""
    if sources.get("reward_fn") != "recipe" or values.get("trust_reward_code"):
        return []
    specs = ", ".join(shorten(s, 80) for s in values.get("reward_fn") or [])
    return [
        f"recipe {shorten(recipe)}: reward_fn {specs} names Python code to run; a recipe's reward code runs only with "
        "--trust-reward-code on the command line (read the file first), or give --reward-fn on the command line"
    ]


def _checked(opts: dict[str, Opt], values: dict, sources: dict) -> list[str]:
    """Required options present; each given value passes its option's check."""
    problems = []
    for name, o in opts.items():
        v = values.get(name)
        if v is None:
            if o.required:
                problems.append(f"missing {o.cli_flag} (or recipe key '{o.recipe_key}')")
            continue
        if o.check is None or sources[name] == "default":
            continue
        items = v if isinstance(v, list) else list(v.items()) if isinstance(v, dict) else [v]
        for item in items:
            problem = o.check(item)
            if problem:
                where = o.cli_flag if sources[name] == "cli" else f"recipe key '{o.recipe_key}'"
                problems.append(f"{where} {problem}, got {quote(item)}")
    return problems


def _command_defaults(command: str, values: dict) -> None:
    """The defaults that depend on the command (LR, max length, output directory)."""
    if command in COMMAND_DEFAULT_LR and values.get("lr") is None:
        values["lr"] = COMMAND_DEFAULT_LR[command]
    source = values.get("model" if command != "pretrain" else "dataset")
    if command in TRAINING and not values.get("output_dir") and source:
        values["output_dir"] = default_output_dir(command, source)
    if "max_length" in values and values.get("max_length") is None:
        values["max_length"] = COMMAND_DEFAULT_MAX_LENGTH[command]
    for name, by_command in COMMAND_DEFAULTS.items():
        if name in values and values.get(name) is None:
            values[name] = by_command[command]


def resolve(command: str, cli_values: dict[str, Any], argv: list[str] | None = None) -> RunConfig:
    """defaults < recipe < command line; validate everything; raise ConfigErrors listing all problems."""
    opts = {o.name: o for o in options_for(command)}
    values, sources = _defaults(opts)
    problems: list[str] = []
    if cli_values.get("recipe"):
        problems += _apply_recipe(command, cli_values["recipe"], opts, values, sources)
    problems += _apply_cli(cli_values, opts, values, sources)
    problems += _recipe_code(cli_values.get("recipe"), values, sources)
    problems += _checked(opts, values, sources)
    _command_defaults(command, values)
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
    problems += _loss_checks(v)
    if command in ("dpo", "kto") and v.get("beta") is not None and v["beta"] <= 0:
        problems.append(f"--beta must be > 0 for {command} (β = 0 removes the preference signal), got {v['beta']:g}")
    if command in ONLINE_RL:
        problems += _online_checks(command, v)
    if command == "distill" and v.get("beta") is not None and not 0 <= v["beta"] <= 1:
        problems.append(f"--beta for distill is the divergence's mix and must be in [0, 1], got {v['beta']:g}")
    if command == "distill" and v.get("temperature") is not None and v["temperature"] <= 0:
        problems.append("--temperature must be > 0 for distill (it divides the logits of both models)")
    if command == "kto" and (v.get("batch_size") or 0) < 2:
        problems.append(
            "kto needs --batch-size 2 or more: TRL estimates KTO's KL term from the other completions of the batch"
        )
    if command == "generate" and (v.get("prompt") is None) == (v.get("prompts") is None):
        problems.append("give either --prompt TEXT or --prompts FILE (one of them)")
    if command == "generate" and v.get("output") and v.get("prompt") is not None:
        problems.append("--output goes with --prompts FILE (a single --prompt is printed)")
    if command == "generate" and v.get("prompts") and not os.path.isfile(os.path.expanduser(v["prompts"])):
        problems.append(f"--prompts: {v['prompts']} does not exist")
    if command == "eval" and not v.get("text") and not v.get("sft_dataset"):
        problems.append("nothing to evaluate: give --text FILE (repeatable) and/or --sft-dataset FILE")
    for key in (
        "dataset",
        "eval_dataset",
        "replay_dataset",
        "sft_dataset",
        "ref_model",
        "model",
        "reference",
        "teacher",
    ):
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


def _online_checks(command: str, v: dict[str, Any]) -> list[str]:
    """grpo / rloo: at least one reward, one weight per reward, groups that fit the batch, varied samples."""
    problems = []
    n_rewards = len(v.get("reward_regex") or []) + bool(v.get("reward_match")) + len(v.get("reward_fn") or [])
    if n_rewards == 0:
        problems.append(
            f"{command} needs a reward: --reward-regex REGEX, --reward-match COLUMN and/or --reward-fn "
            "module:function (each repeatable but the match)"
        )
    weights = v.get("reward_weights")
    if weights is not None and n_rewards and len(weights) != n_rewards:
        problems.append(
            f"--reward-weights has {len(weights)} weight(s) for {n_rewards} reward(s): give one per reward, in the "
            "order regexes, match, functions"
        )
    if v.get("answer_pattern") and not v.get("reward_match"):
        problems.append("--answer-pattern goes with --reward-match COLUMN (it finds the answer to compare)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_step, groups = (v.get("batch_size") or 1) * (v.get("grad_accum") or 1) * world, v.get("num_generations") or 2
    if per_step % groups:
        problems.append(
            f"--batch-size × --grad-accum{' × ranks' if world > 1 else ''} = {per_step} completions per step is not a "
            f"multiple of --num-generations {groups}: each prompt's {groups} completions are scored together; "
            f"e.g. --batch-size {groups * max(1, round(per_step / groups))}"
        )
    has_eval = bool(v.get("eval_split") or v.get("eval_dataset"))
    if has_eval and ((v.get("batch_size") or 1) * world) % groups:
        problems.append(
            f"with an eval set, --batch-size{' × ranks' if world > 1 else ''} must be a multiple of "
            f"--num-generations {groups} (the eval batch holds whole groups)"
        )
    if v.get("temperature") is not None and v["temperature"] <= 0:
        problems.append(
            f"--temperature must be > 0 for {command}: greedy decoding samples the same completion {groups} times, "
            "so the group's rewards never differ"
        )
    return problems


def _loss_checks(v: dict[str, Any]) -> list[str]:
    """dpo's --loss-type / --loss-weights: each loss once, one weight per loss, the losses TRL would refuse later."""
    types, weights = v.get("loss_type") or [], v.get("loss_weights")
    problems = []
    twice = sorted({t for t in types if types.count(t) > 1})
    if twice:
        problems.append(
            f"--loss-type {', '.join(twice)} given more than once: give each loss once (--loss-weights "
            "sets how much it counts)"
        )
    if weights is not None and len(weights) != len(types):
        problems.append(
            f"--loss-weights has {len(weights)} weight(s) for {len(types)} --loss-type loss(es) "
            f"({', '.join(types)}): give one weight per loss, in the same order"
        )
    if "exo_pair" in types:
        smoothing = (v.get("trainer_args") or {}).get("label_smoothing", 0)
        try:
            ok = float(smoothing) > 0
        except (TypeError, ValueError):
            ok = True  # a malformed value is reported by the --trainer-arg check, naming the field's type
        if not ok:
            problems.append("--loss-type exo_pair needs label smoothing ε > 0: add --trainer-arg label_smoothing=1e-3")
    return problems
