"""What a finished run writes and prints about itself besides the model: the forgetting report to the trackers,
drift.json / drift.png, the model card (README.md), and the interrupt message with its resume command."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from posttrainllm.reporting import banner
from posttrainllm.rundir.layout import write_json

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def report_interrupt(cfg: RunConfig, trainer, guard) -> None:
    """Where the interrupt checkpoint is and the command that resumes (rank 0); a note from any other rank that
    stopped because another one received the signal."""
    import shlex
    import signal

    from posttrainllm import distributed

    step = trainer.state.global_step
    why = f" (another rank received {signal.Signals(guard.signum).name})" if guard.from_other_rank else ""
    if not trainer.is_world_process_zero():
        if guard.from_other_rank:
            print(
                f"rank {os.environ.get('RANK', '?')}: stopped at step {step}{why}; "
                f"checkpoint saved in {cfg.output_dir}",
                file=sys.stderr,
                flush=True,
            )
        return
    args = [a for a in cfg.argv if a != "--overwrite"]
    resume_cmd = "posttrainllm " + " ".join(shlex.quote(a) for a in args + ([] if "--resume" in args else ["--resume"]))
    where = " (under the same launcher, on every node)" if distributed.world_size() > 1 else ""
    banner.console.print(
        banner.styled(
            ("interrupted", "yellow"),
            f" at step {step}{why}: checkpoint saved in {cfg.output_dir}. Resume with{where}:\n  {resume_cmd}",
        )
    )


def log_forgetting(trainer, report: dict) -> None:
    """The forgetting report to the experiment trackers too (ood/<file>/ppl_before, ppl_after, change_pct, kl)."""
    logs = {}
    for name, r in report.items():
        for key, value in (
            ("ppl_before", r.get("before")),
            ("ppl_after", r.get("after")),
            ("change_pct", r.get("change_pct")),
            ("kl", r.get("kl")),
        ):
            if isinstance(value, (int, float)) and math.isfinite(value):
                logs[f"ood/{name}/{key}"] = value
    if logs and trainer.args.report_to not in (None, "none", [], ["none"]):
        trainer.log(logs)


def write_drift(run_dir, out: Path, report: dict) -> None:
    from posttrainllm.reporting import drift

    run_dir.own(["drift.json", "drift.png"])
    write_json(out / "drift.json", report)
    note = drift.plot(report, out / "drift.png", title=f"weight drift per depth: {out.name}")
    if note:
        banner.note(note)


def write_model_card(
    cfg: RunConfig,
    run_dir,
    plan,
    prepared,
    metrics: dict,
    forgetting: dict | None,
    drift_report: dict | None,
    model_path: str | None = None,
    extra: dict | None = None,
) -> None:
    from posttrainllm.reporting import model_card

    run_dir.own(["README.md"])
    data = {
        "source": prepared.source,
        "format": prepared.format,
        "n_train": prepared.n_train,
        "n_eval": prepared.n_eval,
        "eval_source": prepared.eval_source,
    }
    text = model_card.render(
        command=cfg.command,
        argv=cfg.argv,
        recipe=cfg.recipe,
        base_model=cfg.model,  # None from scratch (pretrain has no --model)
        plan=plan,
        data=data,
        metrics=metrics,
        forgetting=forgetting,
        drift=drift_report,
        output_dir=cfg.output_dir,
        model_source=gguf_record(model_path),
        budget=(extra or {}).get("budget"),
        probe=(extra or {}).get("probe"),
    )
    tmp = Path(cfg.output_dir) / "README.md.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(Path(cfg.output_dir) / "README.md")


def gguf_record(model_path: str | None) -> dict | None:
    """The GGUF file a model directory was converted from (for the model card), if it was."""
    from posttrainllm.models import gguf

    return gguf.read_source(model_path) if model_path else None
