"""Rich output: the run banner with the per-block LR table, and end-of-run summaries.

The console reads no markup: every string printed (a path, a data value, a hint such as
`pip install 'posttrainllm[plot]'`) is shown as it is; styles are given as `rich.text.Text` parts (`note`, `styled`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console(highlight=False, soft_wrap=True, markup=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Plain strings and (text, style) pairs as one line; nothing in them is read as markup."""
    return Text.assemble(*parts)


def note(text: str) -> None:
    """`note: TEXT` (the word in yellow); TEXT is printed as it is (brackets included)."""
    console.print(styled(("note:", "yellow"), " ", str(text)))


def format_lr(x: float) -> str:
    """3 significant digits, trailing zeros dropped, e-notation below 1e-2 (e.g. 2.32e-06, 3e-05, 0.5): enough that
    the printed block_0/head ratio matches γ^(N-1) to better than 0.5%."""
    if x == 0 or abs(x) >= 1e-2:
        return f"{x:.3g}"
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"


def fmt_lr(x: float | None) -> str:
    return "-" if x is None else format_lr(x)


def summary_line(plan) -> str:
    """`γ=0.95 → block_0 LR=2.57e-05, head LR=3e-05` (the lowest block's LR, clamp included, and the head's)."""
    if not plan.structure_found:
        return f"γ={plan.gamma:g} (flat: block list not resolved) → all LR={format_lr(plan.base_lr)}"
    low = plan.base_lr * max(plan.gamma ** (plan.num_layers - 1), plan.min_scale)
    text = f"γ={plan.gamma:g} → block_0 LR={format_lr(low)}, head LR={format_lr(plan.base_lr)}"
    if plan.vision is not None:
        text += "; " + vision_summary(plan)
    if plan.frozen_param_names:
        text += f", {len(plan.frozen_param_names)} tensors frozen ({freeze_reasons(plan)})"
    extras = [f"{pattern}×{factor:g}" for pattern, factor in plan.lr_groups.items()]
    if plan.loraplus_ratio != 1.0:
        extras.append(f"LoRA+ B×{plan.loraplus_ratio:g}")
    if extras:
        text += f"; LR factors: {', '.join(extras)}"
    return text


def freeze_reasons(plan) -> str:
    """What froze the plan's frozen tensors: a scale below --llrd-freeze-below, --freeze-vision, an LR factor 0."""
    why = [f"scale < {plan.freeze_below:g}"] if plan.freeze_below > 0 else []
    why += ["--freeze-vision"] if plan.vision is not None and plan.vision["freeze"] else []
    zero = bool(plan.vision is not None and plan.vision["projector_scale"] == 0) or 0 in plan.lr_groups.values()
    return ", ".join(why + (["LR factor 0"] if zero or not why else []))


def vision_summary(plan) -> str:
    """`vision γ_v=0.8 (24 blocks) → vision.block_0 LR=…, vision.block_23 LR=…; projector ×2 → LR=…` (or the tower
    frozen): a vision-language model's towers."""
    v = plan.vision
    m, gv, ps = v["num_layers"], v["gamma"], v["projector_scale"]
    if v["freeze"]:
        text = f"vision tower frozen ({m} blocks)"
    else:
        low = plan.base_lr * max(gv ** (m - 1), plan.min_scale)
        text = (
            f"vision γ_v={gv:g} ({m} blocks) → vision.block_0 LR={format_lr(low)}, "
            f"vision.block_{m - 1} LR={format_lr(plan.base_lr)}"
        )
    return text + f"; projector ×{ps:g} → LR={format_lr(plan.base_lr * ps)}" + (" (frozen)" if ps == 0 else "")


def fmt_count(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def llrd_row(plan) -> str:
    """`LR layer-decay: γ=0.95 → block_0 LR=2.3e-06, head LR=3e-05`."""
    return f"LR layer-decay: {summary_line(plan)}"


def tied_row(plan) -> str | None:
    if not plan.tied:
        return None
    where = (
        "decayed like block_0 (policy 'embedding')"
        if plan.tied_policy == "embedding"
        else "base LR like the head (policy 'head')"
    )
    total = sum(r["n_params"] for r in plan.rows)
    tied_n = next((r["n_params"] for r in plan.rows if r.get("tied")), 0)
    share = f" ({100 * tied_n / total:.0f}% of the trainable parameters)" if total and tied_n >= 0.2 * total else ""
    return f"tied input/output embeddings{share}: {plan.tied_param_name} trains at {fmt_lr(plan.tied_lr)}, {where}"


def tied_elsewhere(plan, row) -> str | None:
    """For the row that would hold a tied input/output matrix under the other policy, and holds nothing else:
    where that matrix trains (it is one tensor, grouped once, at the depth its policy gives it)."""
    if not plan.tied or row.get("n_params"):
        return None
    if row.get("depth") == 0 and plan.tied_policy == "head":
        return "tied to the head: trains at the head's LR"
    if row.get("block") == "head" and plan.tied_policy == "embedding":
        return "tied to the embeddings: trains at their LR"
    return None


def block_table(plan) -> Table:
    """One row per depth; a "× factors" column when --lr-group / --loraplus-ratio put extra factors on top."""
    t = Table(title="per-block learning rates", title_justify="left", show_edge=False, pad_edge=False)
    with_factors = any(r.get("factors") for r in plan.rows)
    cols = [("block", "left"), ("params", "right"), ("LR", "right"), ("scale", "right")]
    cols += [("× factors", "left")] if with_factors else []
    cols += [("weight decay", "right"), ("frozen", "left")]
    for col, just in cols:
        t.add_column(col, justify=just)
    for r in plan.display_order:
        name = r["block"] + (" (tied)" if r.get("tied") else "")
        frozen = "yes" if r.get("frozen") else ("not trainable" if not r.get("trainable", True) else "")
        if frozen == "not trainable" and (where := tied_elsewhere(plan, r)):
            frozen = where
        cells = [name, fmt_count(r["n_params"]), fmt_lr(r["lr"]), f"{r['scale']:.4g}"]
        cells += [", ".join(r.get("factors", []))] if with_factors else []
        t.add_row(*cells, f"{r['weight_decay']:g}", frozen)
    return t


def print_banner(title: str, info: dict[str, Any], plan, notes: Sequence[str] = ()) -> None:
    """The run banner: what runs on what, then the layer-decay row and the per-block table."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column(overflow="fold")  # a long path folds onto the next line whole, never cut to an ellipsis
    for k, v in info.items():
        if v not in (None, ""):
            t.add_row(k, str(v))
    console.rule(styled((f"posttrainllm {title}", "bold")))
    console.print(t)
    console.print(llrd_row(plan))
    if tied := tied_row(plan):
        console.print(tied)
    if plan.frozen_param_names:
        frozen_blocks = [r["block"] for r in plan.display_order if r.get("frozen")]
        console.print(
            f"frozen ({freeze_reasons(plan)}): {', '.join(frozen_blocks) or 'parameters matched by the LR factors'} "
            f"({len(plan.frozen_param_names)} tensors, "
            f"{fmt_bytes(plan.frozen_state_bytes_saved)} of AdamW state saved)"
        )
    if plan.min_scale > 0:
        console.print(f"LR scale clamped at {plan.min_scale:g} (--llrd-min-scale)")
    for w in list(plan.warnings) + list(notes):
        note(w)
    console.print(block_table(plan))
    console.print(f"{len(plan.groups)} optimizer groups")


def print_forgetting(report: dict[str, dict]) -> None:
    t = Table(title="out-of-domain perplexity (forgetting)", title_justify="left")
    with_kl = any(r.get("kl") is not None for r in report.values())
    for col in ("text", "before", "after", "change") + (("KL(base ‖ tuned)/token",) if with_kl else ()):
        t.add_column(col, justify="left" if col == "text" else "right")
    for name, r in report.items():
        change = "-" if r.get("change_pct") is None else f"{r['change_pct']:+.2f}%"
        row = [name, f"{r['before']:.3f}", f"{r['after']:.3f}", change]
        if with_kl:
            row.append("-" if r.get("kl") is None else f"{r['kl']:.4f}")
        t.add_row(*row)
    console.print(t)


def print_summary(
    metrics: dict[str, Any], output_dir: str, *, first_step: int = 0, last_step: int | None = None
) -> None:
    """End of a run: a small table (losses, runtime, throughput, where the model went), not a Python dict.

    After a resume, the trainer's train_loss covers only the resumed steps: the row says which steps."""
    t = Table(title="run summary", title_justify="left", show_edge=False, pad_edge=False, show_header=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    loss_fmt = "{:.4f}" if not first_step else "{:.4f} " + f"(steps {first_step + 1}-{last_step}: resumed run)"
    rows = [
        ("train loss", metrics.get("train_loss"), loss_fmt),
        ("eval loss", metrics.get("eval_loss"), "{:.4f}"),
        ("reward accuracy (eval)", metrics.get("eval_rewards/accuracies"), "{:.3f}"),
        ("runtime", metrics.get("train_runtime"), "{:.1f} s"),
        ("samples/s", metrics.get("train_samples_per_second"), "{:.2f}"),
    ]
    for name, value, fmt in rows:
        if isinstance(value, (int, float)):
            t.add_row(name, fmt.format(value))
    t.add_row("model saved to", str(output_dir))
    console.print(t)


def print_probe(probe: dict[str, Any]) -> None:
    """The forgetting probe: how far the run moved on the starting model's own samples (evaluate/probe.py)."""
    console.print(
        f"forgetting probe: KL(start ‖ tuned) = {probe['kl']:.5f} per token on {probe['samples']} samples of the "
        f"starting model ({probe['tokens']} tokens; --ood-eval FILE measures forgetting on your own text)"
    )


def print_budget(budget: dict[str, Any]) -> None:
    """--max-forgetting's outcome: the α chosen, the share of the in-domain gain kept, every α tried."""
    from posttrainllm.merging.budget import change_text, measure_label, outcome

    tried = ", ".join(f"α {t['alpha']:g}: {change_text(t['ppl_change_pct'])}" for t in budget["tried"])
    head = f"forgetting budget {budget['max_forgetting_pct']:g}%: {outcome(budget)}"
    console.print(f"{head}; {measure_label(budget)} at {tried}")


def print_drift(report: dict[str, Any]) -> None:
    from posttrainllm.reporting.drift import bar_chart

    console.print("weight drift per depth (‖ΔW‖/‖W‖):")
    console.print(bar_chart(report))
