"""`posttrainllm demo`: the whole tool, offline, in a few minutes on 2 CPU cores.

1. data the project makes itself: Python standard-library sources of the running interpreter (pre-training
   text and a held-out set of other modules) and a generated instruction set (posttrainllm.demo_data);
2. `pretrain` a tiny llama-style model on the stdlib text;
3. `sft` it on the instructions twice, flat and with `--llrd`, each measuring the held-out code perplexity
   before and after (`--ood-eval`);
4. a comparison table: in-domain validation loss and out-of-domain perplexity change.
Every stage runs through the same code path as the CLI commands (config.resolve → run.*).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from posttrainllm import banner
from posttrainllm.config import resolve
from posttrainllm.errors import UsageError
from posttrainllm.rundir.layout import write_json

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

DEMO_GAMMA = 0.8
TABLE_TITLE = "demo: flat vs layer-wise LR decay (same base, data, steps and LR)"
DEMO_ENTRIES = ("data", "base", "sft-flat", f"sft-llrd-{DEMO_GAMMA}", "demo_results.json")  # what the demo writes


def _stage(command: str, values: dict) -> None:
    import importlib

    cfg = resolve(command, values)
    importlib.import_module(f"posttrainllm.commands.{command}").main(cfg)


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
    """The comparison table of the demo's runs (`summary`: label -> eval_loss, before, after, change_pct)."""
    t = Table(title=TABLE_TITLE, title_justify="left")
    for col in ("run", "val loss (instructions)", "held-out code PPL before", "after", "change"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for label, r in summary.items():
        t.add_row(label, f"{r['eval_loss']:.4f}", f"{r['before']:.2f}", f"{r['after']:.2f}", f"{r['change_pct']:+.1f}%")
    return t


def render_table(summary: dict) -> str:
    """The table as plain text, the same on every terminal (the README quotes it; tests/e2e/test_demo.py checks it)."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=100, markup=False, highlight=False, color_system=None)
    console.print(results_table(summary))
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines())


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


def run_demo(cfg: RunConfig) -> None:
    from posttrainllm.demo_data import write_demo_files

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
    _stage(
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
    runs = {"flat (γ=1.0)": "1.0", f"LLRD (γ={DEMO_GAMMA})": str(DEMO_GAMMA)}
    for gamma in runs.values():
        name = "sft-flat" if gamma == "1.0" else f"sft-llrd-{gamma}"
        _stage(
            "sft",
            {
                **common,
                "model": str(out / "base"),
                "dataset": str(files["instructions"]),
                "eval_dataset": str(files["instructions_eval"]),
                "output_dir": str(out / name),
                "ood_eval": [str(files["heldout_code"])],
                "llrd": gamma,
                "lr": "1e-3",
                "max_steps": "60" if quick else "150",
                "batch_size": "16",
            },
        )
    summary = {}
    for label, gamma in runs.items():
        name = "sft-flat" if gamma == "1.0" else f"sft-llrd-{gamma}"
        res = json.loads((out / name / "eval_results.json").read_text())
        ood = next(iter(res["ood"].values()))
        summary[label] = {"eval_loss": res["train"].get("eval_loss"), **ood}
    write_json(out / "demo_results.json", summary)
    print(render_table(summary))
    env = environment(quick)
    banner.console.print(
        f"(torch {env['torch']}, transformers {env['transformers']}, {env['threads']} threads, seed {env['seed']}"
        f"{', --quick' if quick else ''}: the numbers depend on these)"
    )
    banner.console.print(
        "At the same base LR, layer decay trades a little in-domain progress "
        "for much less drift of what the base knew. "
        "docs/results.md compares it with simply lowering the LR (at equal in-domain loss it still forgets less) and "
        f"with replay (--replay-dataset), which brings forgetting near zero. Results: {out / 'demo_results.json'}"
    )
