"""The README.md model card of a trained model: what was done, to what, with which per-block LRs, on which data,
and what it did to held-out text. Hub-ready YAML front matter (base_model, library_name, tags)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

_PIPELINE_TAG = {"reward": "text-classification"}  # a reward model scores text; every other command generates it


def _is_hub_id(ref: str) -> bool:
    return not Path(ref).expanduser().exists() and ref.count("/") <= 1 and not ref.startswith((".", "/", "~"))


def _fmt(x: Any, digits: int = 4) -> str:
    return f"{x:.{digits}f}" if isinstance(x, float) else "-" if x is None else str(x)


def render(
    *,
    command: str,
    argv: list[str],
    recipe: str | None,
    base_model: str | None,
    plan,
    data: dict[str, Any],
    metrics: dict[str, Any],
    forgetting: dict | None = None,
    drift: dict | None = None,
    output_dir: str = "",
    model_source: dict | None = None,
    budget: dict | None = None,
    probe: dict | None = None,
) -> str:
    """The card's text. `data`: source, format, n_train, n_eval (and eval source); `metrics`: the trainer's."""
    hub_base = base_model if base_model and _is_hub_id(base_model) else None
    tags = ["posttrainllm", command] + (["llrd"] if plan is not None and plan.lr_scaled else [])
    front = ["---"]
    if hub_base:
        front.append(f"base_model: {hub_base}")
    front += (
        ["library_name: transformers", f"pipeline_tag: {_PIPELINE_TAG.get(command, 'text-generation')}", "tags:"]
        + [f"- {t}" for t in tags]
        + ["---", ""]
    )
    name = Path(output_dir).name or "model"
    lines = [
        f"# {name}",
        "",
        f"This model was {_origin(base_model, hub_base, model_source)} with `posttrainllm {command}`.",
        "",
        "## How it was trained",
        "",
        "```bash",
        "posttrainllm " + " ".join(shlex.quote(a) for a in argv),
        "```",
        "",
    ]
    if recipe:
        lines += [f"Recipe: `{recipe}` (command-line flags override it).", ""]
    lines += _plan_section(plan) + _data_section(data) + _results_section(metrics)
    lines += _forgetting_section(forgetting) + _probe_section(probe) + _budget_section(budget) + _drift_section(drift)
    return "\n".join(front + lines)


def _probe_section(probe: dict | None) -> list[str]:
    """The forgetting probe (no --ood-eval): KL(start ‖ tuned) on the starting model's own samples."""
    if not probe:
        return []
    return [
        "## Forgetting probe (no held-out text given)",
        "",
        f"KL(start ‖ tuned) per token on {probe['samples']} samples of the starting model ({probe['tokens']} "
        f"tokens): {_fmt(probe['kl'], 5)}. 0 means the model did not move on the starting model's own text.",
        "",
    ]


def _budget_section(budget: dict | None) -> list[str]:
    """--max-forgetting: the α chosen toward the starting model, the share of the gain kept, every α tried."""
    if not budget:
        return []
    from posttrainllm.merging.budget import change_text, measure_label, outcome

    label = measure_label(budget)
    what = f"Forgetting budget {budget['max_forgetting_pct']:g}% ({label}): {outcome(budget)}."
    lines = ["## Forgetting budget (--max-forgetting)", "", what, "", f"| α | {label} |", "|---|---|"]
    lines += [f"| {t['alpha']:g} | {change_text(t['ppl_change_pct'])} |" for t in budget["tried"]]
    return lines + [""]


def _origin(base_model: str | None, hub_base: str | None, model_source: dict | None) -> str:
    if base_model is None:
        origin = "trained from scratch"
    elif hub_base:
        origin = f"fine-tuned from [{hub_base}](https://huggingface.co/{hub_base})"
    else:
        origin = f"fine-tuned from the local model `{base_model}`"
    if model_source:  # a GGUF file: name its quantization, since training started from dequantized weights
        origin += (
            f" (a GGUF file, {model_source['quantization']} weights dequantized to float; "
            f"sha256 {str(model_source.get('sha256', '?'))[:12]}…)"
        )
    return origin


def _plan_section(plan) -> list[str]:
    from posttrainllm.reporting.banner import format_lr, summary_line, tied_elsewhere

    if plan is None:
        return []
    lines = [
        f"Layer-wise LR decay: {summary_line(plan)}.",
        "",
        "| depth | LR | scale | factors | frozen |",
        "|---|---|---|---|---|",
    ]
    for r in plan.rows:
        frozen = "yes" if r.get("frozen") else ("not trained" if not r.get("trainable", True) else "")
        if frozen == "not trained" and (where := tied_elsewhere(plan, r)):
            frozen = where
        lines.append(
            f"| {r['block']}{' (tied)' if r.get('tied') else ''} | {format_lr(r['lr'])} | {r['scale']:.4g} | "
            f"{', '.join(r.get('factors', [])) or '-'} | {frozen} |"
        )
    return lines + [""]


def _data_section(data: dict[str, Any]) -> list[str]:
    counts = f"{data.get('n_train')} training rows" + (
        f", {data.get('n_eval')} eval rows" if data.get("n_eval") else ""
    )
    return [
        "## Data",
        "",
        f"`{data.get('source')}` ({data.get('format')}): {counts}."
        + (f" Eval data: `{data['eval_source']}`." if data.get("eval_source") else ""),
        "",
    ]


_RESULT_KEYS = (
    "train_loss",
    "eval_loss",
    "eval_rewards/accuracies",
    "eval_rewards/margins",
    "train_runtime",
    "train_samples_per_second",
)


def _results_section(metrics: dict[str, Any]) -> list[str]:
    lines = ["## Results", "", "| metric | value |", "|---|---|"]
    lines += [f"| {key} | {_fmt(metrics[key])} |" for key in _RESULT_KEYS if metrics.get(key) is not None]
    return lines + [""]


def _forgetting_section(forgetting: dict | None) -> list[str]:
    if not forgetting:
        return []
    with_kl = any(r.get("kl") is not None for r in forgetting.values())
    lines = [
        "## Forgetting (held-out text perplexity before → after)",
        "",
        "| text | before | after | change |" + (" KL(base ‖ tuned) per token |" if with_kl else ""),
        "|---|---|---|---|" + ("---|" if with_kl else ""),
    ]
    for text, r in forgetting.items():
        change = "-" if r.get("change_pct") is None else f"{r['change_pct']:+.2f}%"
        kl = f" {_fmt(r.get('kl'), 4)} |" if with_kl else ""
        lines.append(f"| {text} | {_fmt(r.get('before'), 3)} | {_fmt(r.get('after'), 3)} | {change} |{kl}")
    return lines + [""]


def _drift_section(drift: dict | None) -> list[str]:
    if not drift:
        return []
    lines = ["## Weight drift per depth (‖ΔW‖ / ‖W‖)", "", "| depth | drift |", "|---|---|"]
    return lines + [f"| {r['block']} | {r['drift']:.3g} |" for r in drift["depths"]] + [""]
