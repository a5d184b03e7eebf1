"""resolve: defaults < recipe < command line → one typed, validated RunConfig; every problem reported at once,
before any model or data is loaded. Imports no torch/transformers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from posttrainllm.config.coerce import option_value, quote
from posttrainllm.config.inputs import entries, eval_cache_problems, input_options
from posttrainllm.config.opt import PATH, Opt
from posttrainllm.config.options import RECIPE_KEYS, options_for
from posttrainllm.config.per_command import default_of
from posttrainllm.config.recipe import load_recipe
from posttrainllm.config.runconfig import RunConfig
from posttrainllm.errors import ConfigErrors, shorten
from posttrainllm.refs import looks_local, special_file
from posttrainllm.spec import CommandSpec


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
            sources[o.name] = "invalid"  # reported here: not "missing" as well
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
            sources[key] = "invalid"  # reported here: not "missing" as well
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
            instead = o.required_unless and values.get(o.required_unless) is not None
            if o.required and sources[name] != "invalid" and not instead:
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


def _command_defaults(spec: CommandSpec, values: dict) -> None:
    """The defaults that depend on the command (its spec's LR, max length, β...; the output directory)."""
    for name in values:
        if values[name] is None and (default := default_of(spec, name)) is not None:
            values[name] = default
    source = values.get("dataset" if spec.from_scratch else "model")
    if spec.trains and not values.get("output_dir") and source:
        values["output_dir"] = default_output_dir(spec, source)


def resolve(spec: CommandSpec, cli_values: dict[str, Any], argv: list[str] | None = None) -> RunConfig:
    """defaults < recipe < command line for the command `spec` describes (the CLI hands it over); validate
    everything; raise ConfigErrors listing all problems."""
    command = spec.name
    opts = {o.name: o for o in options_for(spec)}
    values, sources = _defaults(opts)
    problems: list[str] = []
    if cli_values.get("recipe"):
        problems += _apply_recipe(command, cli_values["recipe"], opts, values, sources)
    problems += _apply_cli(cli_values, opts, values, sources)
    problems += _recipe_code(cli_values.get("recipe"), values, sources)
    problems += _checked(opts, values, sources)
    _command_defaults(spec, values)
    problems += _cross_checks(spec, values, list(opts.values()))
    if problems:
        raise ConfigErrors(problems)
    return RunConfig(command=command, sources=sources, argv=list(argv or [command]), names=tuple(opts), **values)


def default_output_dir(spec: CommandSpec, source: str) -> str:
    """runs/sft-Qwen2.5-0.5B for `sft --model Qwen/Qwen2.5-0.5B`; runs/pretrain-corpus for `pretrain --dataset
    corpus.txt`."""
    name = Path(source.rstrip("/\\")).name or "model"
    if spec.from_scratch:  # a corpus file: its name without the extension
        name = Path(name).stem
    return str(Path("runs") / f"{spec.name}-{name}")


def _cross_checks(spec: CommandSpec, v: dict[str, Any], opts: list[Opt]) -> list[str]:
    command = spec.name
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
    problems += _replay_checks(spec, v)
    if v.get("eval_dataset") and v.get("eval_split"):
        problems.append("give either --eval-dataset or --eval-split, not both")
    if v.get("streaming") and (v.get("max_steps") or -1) <= 0:
        problems.append("--streaming needs --max-steps N: a stream has no length, so --epochs cannot tell when to stop")
    for key in ("lora_alpha", "lora_dropout"):
        if v.get(key) and not v.get("lora_r"):
            problems.append(f"--{key.replace('_', '-')} needs --lora-r")
    if v.get("loraplus_ratio", 1.0) != 1.0 and not v.get("lora_r"):
        problems.append("--loraplus-ratio needs --lora-r (LoRA+ scales the LoRA B matrices)")
    for check in spec.checks:  # the command's own cross-checks (its spec)
        problems += check(command, v)
    problems += eval_cache_problems(v, opts)
    measured = v.get("ood_eval") or v.get("forgetting_probe")  # what a budget is on: held-out text, or the probe
    if v.get("max_forgetting") is not None and spec.trains and not measured:
        problems.append(
            "--max-forgetting needs --ood-eval FILE (the held-out perplexity change) or the forgetting probe "
            "(--forgetting-probe N > 0: the perplexity change of the starting model's own samples)"
        )
    if v.get("max_forgetting") is not None and spec.trains and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        problems.append(
            "--max-forgetting merges the trained weights in place on one process, not across several: train, then "
            "run posttrainllm merge --max-forgetting PCT on the result"
        )
    if v.get("max_forgetting") is not None and v.get("lora_r"):
        problems.append(
            "--max-forgetting merges the trained weights toward the starting ones, which LoRA does not train: "
            "merge the adapter with posttrainllm merge --max-forgetting PCT"
        )
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
    # inputs that are read (every option the table marks as a path): a FIFO, socket or device would block forever or
    # never end, so refuse before opening
    for o in input_options(opts=opts):
        for path in entries(v.get(o.name)) if o.input == PATH else []:
            kind = special_file(path)
            if kind:
                problems.append(f"{o.cli_flag} {shorten(path)} is {kind}, not a regular file: pass a file")
    for path in list(v.get("ood_eval") or []) + list(v.get("text") or []):
        if not special_file(path) and not os.path.isfile(os.path.expanduser(path)):
            problems.append(f"text file not found: {shorten(path)}")
    return problems


_PAIRED = {"preference": "preference pairs (prompt, chosen, rejected)", "unpaired": "labelled completions"}


def _replay_checks(spec: CommandSpec, v: dict[str, Any]) -> list[str]:
    """--replay-dataset / --self-replay N: one replay pool, mixed in at --replay-ratio > 0, for sft and finetune."""
    problems = []
    n = v.get("self_replay") or 0
    command = spec.name
    if n and spec.data in _PAIRED:
        what = _PAIRED[spec.data]
        problems.append(
            f"--self-replay is for sft and finetune: {command} trains on {what}, and a sample of the model is "
            "plain text with no preference to learn; mix replay into an sft or finetune stage, or anchor "
            f"{command} with its reference model (--beta)"
        )
        return problems
    if n and v.get("replay_dataset"):
        problems.append(
            "--self-replay and --replay-dataset both give the replay rows: pick one (to mix both, pass an earlier "
            "run's self_replay.jsonl with your text as one --replay-dataset)"
        )
    elif v.get("replay_ratio") and not (v.get("replay_dataset") or n):
        problems.append("--replay-ratio needs --replay-dataset or --self-replay N")
    elif (v.get("replay_dataset") or n) and not v.get("replay_ratio"):
        problems.append(f"{'--self-replay' if n else '--replay-dataset'} needs --replay-ratio > 0")
    elif n:  # no more samples than the run trains on (the sweep's cells are resolved here too)
        from posttrainllm.data.self_replay import count_problems

        problems += count_problems(v, blocks=spec.data == "text")
    return problems
