"""What a run prints while it trains: one log line per logging step (no progress bars when not interactive)."""

from __future__ import annotations

import os
import sys
from typing import Any


def interactive() -> bool:
    """Progress bars only on a terminal: in a log file (CI, nohup) they are hundreds of redrawn lines."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def quiet_progress_bars() -> None:
    """Outside a terminal, turn off the progress bars of datasets, transformers and the hub (loading, mapping)."""
    if interactive():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


_HIDDEN_LOG_KEYS = ("total_flos", "lr_min", "lr_max")


def log_line(logs: dict[str, Any], step: int, max_steps: int) -> str | None:
    """One readable line per logging step (`step 10/200 · loss 2.3456 · lr 1e-03 · ...`); None for the trainer's
    end-of-training metrics, which the run summary prints as a table."""
    if "train_runtime" in logs:
        return None
    parts = [f"step {step}/{max_steps}"]
    for key, value in logs.items():
        if key in _HIDDEN_LOG_KEYS or key.startswith("lr/"):
            continue
        name = {"learning_rate": "lr"}.get(key, key)
        if isinstance(value, float) and value.is_integer() and abs(value) >= 1 and name != "loss":
            text = str(int(value))
        elif isinstance(value, float):
            text = f"{value:.3g}" if name in ("lr", "grad_norm", "epoch") or abs(value) < 1e-3 else f"{value:.4f}"
        else:
            text = str(value)
        parts.append(f"{name} {text}")
    return " · ".join(parts)


def _log_callbacks():
    from transformers.trainer_callback import ProgressCallback, TrainerCallback

    class PlainLogCallback(TrainerCallback):
        """Without a terminal: one plain line per logging step, no progress bars."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            line = log_line(logs or {}, state.global_step, state.max_steps)
            if state.is_world_process_zero and line:
                print(line, flush=True)

    class BarLogCallback(ProgressCallback):
        """On a terminal: transformers' progress bars, with the same plain lines instead of printed dicts."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            line = log_line(logs or {}, state.global_step, state.max_steps)
            if state.is_world_process_zero and self.training_bar is not None and line:
                self.training_bar.write(line)

    return PlainLogCallback, BarLogCallback
