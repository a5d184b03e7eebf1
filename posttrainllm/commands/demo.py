"""`posttrainllm demo`: the whole tool, offline, in a few minutes on 2 CPU cores.

1. data the project makes itself: Python standard-library sources of the running interpreter (pre-training
   text and a held-out set of other modules) and a generated instruction set (commands/demo_data.py);
2. `pretrain` a tiny llama-style model on the stdlib text;
3. `sft` it on the instructions three times, each measuring the held-out code perplexity before and after
   (`--ood-eval`): flat with a forgetting budget (`--max-forgetting`: its output is the budgeted merge, the trained
   model is kept in sft-flat/unmerged/), with layer decay (`--llrd`), and with 5% replay of the pre-training text;
4. the frontier table: in-domain validation loss and out-of-domain perplexity change of the trained flat model,
   layer decay, replay and the budgeted point (marked ★).
Every stage runs through the same code path as the CLI commands: the CLI hands `main` its `run_command`, which
resolves a stage's values (config.resolve) and calls that command's `main` (so this module imports neither
config/ nor the other commands: config/ reads this module's SPEC through the registry).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrainllm.errors import BudgetNotMet, UsageError
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from rich.table import Table

    from posttrainllm.config.runconfig import RunConfig

# (command, its option values) -> None: resolves the values and runs the command (the CLI's run_command)
RunCommand = Callable[[str, dict[str, Any]], None]

SPEC = CommandSpec(
    name="demo",
    help="Offline end-to-end demo: pre-train a tiny model on stdlib sources, SFT it flat vs with LLRD, compare.",
    runs_commands=True,
)

DEMO_GAMMA = 0.8
DEMO_REPLAY = 0.05  # the replay share that forgot least on the real model (docs/results.md)
DEMO_BUDGET = 20.0  # --max-forgetting of the flat run, in percent
TABLE_TITLE = "demo: flat, layer decay, replay and a forgetting budget (same base, data, steps and LR)"
BUDGET_MARK = "★"
RUNS = {"sft-flat": {"llrd": "1.0"}, f"sft-llrd-{DEMO_GAMMA}": {"llrd": str(DEMO_GAMMA)},
        f"sft-replay-{DEMO_REPLAY}": {"replay_ratio": str(DEMO_REPLAY)}}  # fmt: skip
DEMO_ENTRIES = ("data", "base", *RUNS, "demo_results.json")  # what the demo writes


def _check_demo_dir(out: Path, label: str, overwrite: bool) -> None:
    """A non-empty directory needs --overwrite, and then may hold only what the demo writes. Nothing is deleted here:
    each stage replaces its own run directory the way --overwrite does (posttrainllm/rundir/outdir.py)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output-dir {label} is a file")
    names = sorted(e.name for e in out.iterdir()) if out.is_dir() else []
    if not names:
        return
    if not overwrite:
        raise UsageError(f"--output-dir {label} is not empty; pass --overwrite to replace the demo's results")
    strangers = [n for n in names if n not in DEMO_ENTRIES]
    if strangers:
        raise UsageError(
            f"--output-dir {label} holds {strangers[0]}, which the demo did not "
            "write; --overwrite only replaces the demo's own results: choose "
            "another --output-dir"
        )


def results_table(summary: dict) -> Table:
    """The frontier table of the demo's runs (`summary`: label -> eval_loss, before, after, change_pct; a label
    that starts with BUDGET_MARK is the budgeted point, explained in the caption)."""
    from rich.table import Table

    caption = (
        f"{BUDGET_MARK} the flat run's own output: with --max-forgetting {DEMO_BUDGET:g} it merged itself back toward "
        "the base (to the α shown) until the held-out change was within the budget; the flat row is its trained model."
    )
    t = Table(title=TABLE_TITLE, title_justify="left", caption=caption, caption_justify="left")
    for col in ("run", "val loss (instructions)", "held-out code PPL before", "after", "change"):
        t.add_column(col, justify="left" if col == "run" else "right", no_wrap=col == "run")
    for label, r in summary.items():
        t.add_row(label, f"{r['eval_loss']:.4f}", f"{r['before']:.2f}", f"{r['after']:.2f}", f"{r['change_pct']:+.1f}%")
    return t


def render_table(summary: dict) -> str:
    """The table as plain text, the same on every terminal (the README quotes it; tests/unit/commands/test_demo_parts.py
    checks it)."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=100, markup=False, highlight=False, color_system=None)
    console.print(results_table(summary))
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines())


def collect(out: Path) -> dict:
    """The table's rows from the runs' eval_results.json: the flat run's trained model (its budget record keeps
    the unmerged model's held-out results), layer decay, replay, then the flat run's budgeted output."""

    def row(eval_loss, ood: dict) -> dict:
        return {"eval_loss": eval_loss, **next(iter(ood.values()))}

    flat = json.loads((out / "sft-flat" / "eval_results.json").read_text())
    budget = flat["budget"]
    summary = {"flat (γ=1.0)": row(flat["train"].get("eval_loss"), budget.get("unmerged_results") or flat["ood"])}
    for label, name in ((f"LLRD (γ={DEMO_GAMMA})", f"sft-llrd-{DEMO_GAMMA}"),
                        (f"replay {100 * DEMO_REPLAY:g}% (γ=1.0)", f"sft-replay-{DEMO_REPLAY}")):  # fmt: skip
        res = json.loads((out / name / "eval_results.json").read_text())
        summary[label] = row(res["train"].get("eval_loss"), res["ood"])
    if budget["only_base"]:
        return summary
    eval_loss = budget.get("eval_loss") if budget["alpha"] < 1 else flat["train"].get("eval_loss")
    label = f"{BUDGET_MARK} budget ≤{DEMO_BUDGET:g}% (α={budget['alpha']:.2f})"
    summary[label] = {**row(eval_loss, flat["ood"]), "alpha": budget["alpha"]}
    return summary


def environment(quick: bool) -> dict:
    """What the demo's numbers depend on besides its fixed data, seed and steps."""
    import torch
    import transformers
    import trl

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "threads": torch.get_num_threads(),
        "seed": 0,
        "quick": quick,
    }


def main(cfg: RunConfig, run_command: RunCommand) -> None:
    run_demo(cfg, run_command)


def run_demo(cfg: RunConfig, run_command: RunCommand) -> None:
    """The demo's stages, each through `run_command` (the CLI's: resolve the values, run the command's `main`)."""
    from posttrainllm.commands.demo_data import write_demo_files
    from posttrainllm.reporting import banner
    from posttrainllm.rundir.layout import write_json

    out = Path(cfg.output_dir)
    _check_demo_dir(out, cfg.output_dir, cfg.overwrite)
    files = write_demo_files(out / "data")
    quick = cfg.quick
    common = {
        "max_length": "128",
        "logging_steps": "50",
        "save_steps": "100000",
        "seed": "0",
        "overwrite": cfg.overwrite,
    }
    run_command(
        "pretrain",
        {
            **common,
            "dataset": str(files["pretrain"]),
            "output_dir": str(out / "base"),
            "model_config": "tiny",
            "vocab_size": "2048",
            "max_steps": "150" if quick else "600",
            "batch_size": "16",
            "lr": "2e-3",
            "warmup_ratio": "0.05",
            "lr_scheduler": "cosine",
        },
    )
    for name, extra in RUNS.items():
        values = {**common, "model": str(out / "base"), "dataset": str(files["instructions"]),
            "eval_dataset": str(files["instructions_eval"]), "output_dir": str(out / name),
            "ood_eval": [str(files["heldout_code"])], "lr": "1e-3", "max_steps": "60" if quick else "150",
            "batch_size": "16", **extra}  # fmt: skip
        if "replay_ratio" in extra:
            values["replay_dataset"] = str(files["pretrain"])
        if name == "sft-flat":
            values["max_forgetting"] = str(DEMO_BUDGET)
        try:
            run_command("sft", values)
        except BudgetNotMet:  # only the base is within the budget: the table then has no budgeted row
            pass
    summary = collect(out)
    write_json(out / "demo_results.json", summary)
    print(render_table(summary))
    env = environment(quick)
    banner.console.print(
        f"(torch {env['torch']}, transformers {env['transformers']}, {env['threads']} threads, seed {env['seed']}"
        f"{', --quick' if quick else ''}: the numbers depend on these)"
    )
    banner.console.print(
        "On this toy run layer decay and replay forget less than flat at the same LR, and --max-forgetting meets "
        "its bound by itself. On a real model (SmolLM2-135M, docs/results.md), compared at equal in-domain loss, "
        "replay and self-replay forgot least, then merging back toward the base; layer decay was not among the "
        f"winners. Results: {out / 'demo_results.json'}"
    )
