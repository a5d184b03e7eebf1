"""Nothing lost on a crash: complete-checkpoint markers, SIGTERM/SIGINT → checkpoint, atomic final save.

- A checkpoint counts as complete only once `checkpoint-N/COMPLETE` exists and what it lists is there: the marker
  is written by a callback after transformers has finished writing every file of the checkpoint (after a barrier
  under torchrun), and records each file's name and size. `--resume` verifies them and skips a checkpoint that
  fails (a half-written one, or one whose optimizer state or weights were removed since), saying why.
- SIGTERM/SIGINT during training: the current step finishes, a checkpoint is saved, the run exits with
  143 (SIGTERM) or 130 (SIGINT) after printing the resume command. A second signal stops at once with the same
  exit code (the checkpoint it cut short has no marker).
- The final model is written to `OUT/.posttrainllm/final-tmp/`, its names recorded as posttrainllm's own
  (posttrainllm/outdir.py), then moved into `OUT/` with `config.json` last and `training_complete.json` (which
  lists the files and sizes) after it: a crash mid-save never leaves a directory that loads as a model. Weights
  holding NaN/inf are never saved, neither as a checkpoint nor as the final model.
- Output-directory ownership, locking and `--overwrite` live in posttrainllm/outdir.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
from pathlib import Path

from posttrainllm.distributed import max_over_ranks
from posttrainllm.errors import TrainingError, UsageError

MARKER = "COMPLETE"
FINAL_MARKER = "training_complete.json"
RUN_CONFIG = "run_config.json"
EXIT_SIGTERM, EXIT_SIGINT = 143, 130
_CKPT = re.compile(r"^checkpoint-(\d+)$")

# keys that change what a resumed optimizer would do; resuming with other values is refused by default
RESUME_KEYS = (
    "model",
    "lr",
    "llrd",
    "llrd_min_scale",
    "llrd_freeze_below",
    "llrd_blocks",
    "tied_embeddings",
    "lr_groups",
    "loraplus_ratio",
    "weight_decay",
    "optim",
    "lr_scheduler",
    "warmup_ratio",
    "lora_r",
    "lora_alpha",
    "lora_targets",
    "batch_size",
    "grad_accum",
    "max_steps",
    "epochs",
    "seed",
    "model_config",
)


def is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def file_sizes(d: Path) -> dict[str, int]:
    """Every file under `d` (relative POSIX path -> size), the COMPLETE marker excepted."""
    return {
        f.relative_to(d).as_posix(): f.stat().st_size for f in sorted(d.rglob("*")) if f.is_file() and f.name != MARKER
    }


def _listed_files_problem(d: Path, files, what: str) -> str | None:
    if not isinstance(files, dict) or not files:
        return f"its {what} does not list the files it holds (written by an older version?)"
    for name, size in files.items():
        f = d / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, its {what} says {size}"
    return None


def verify_checkpoint(d: Path) -> str | None:
    """None when checkpoint `d` is complete: its COMPLETE marker exists and every file it lists has the listed size."""
    marker = d / MARKER
    if not marker.is_file():
        return "no COMPLETE marker: its save was cut short"
    try:
        files = json.loads(marker.read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        files = None
    return _listed_files_problem(d, files, "COMPLETE marker")


def finished_run(out: Path) -> dict | None:
    """The training_complete.json of a finished run whose final files are all there (None otherwise)."""
    try:
        done = json.loads((Path(out) / FINAL_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(done, dict):
        return None
    if "files" in done and _listed_files_problem(Path(out), done["files"], FINAL_MARKER):
        return None
    return done


def checkpoint_dirs(out) -> list[Path]:
    """checkpoint-N directories of `out`, oldest first."""
    p = Path(out)
    if not p.is_dir():
        return []
    found = [
        (int(m.group(1)), d) for d in p.iterdir() if (m := _CKPT.match(d.name)) and d.is_dir() and not d.is_symlink()
    ]
    return [d for _, d in sorted(found)]


def checkpoint_step(d: Path) -> int:
    return int(_CKPT.match(d.name).group(1))


def resume_checkpoint(out) -> tuple[Path, list[tuple[Path, str]]]:
    """(newest complete checkpoint, [(newer checkpoint skipped, why)]); UsageError when none is complete."""
    skipped = []
    for d in reversed(checkpoint_dirs(out)):
        problem = verify_checkpoint(d)
        if problem is None:
            return d, skipped
        skipped.append((d, problem))
    extra = f" ({len(skipped)} incomplete checkpoint(s) skipped: {describe_skipped(skipped)})" if skipped else ""
    raise UsageError(f"--resume: no complete checkpoint in {out}{extra}")


def describe_skipped(skipped: list[tuple[Path, str]]) -> str:
    return "; ".join(f"{d.name} ({why})" for d, why in skipped)


def _saved_config(out) -> dict | None:
    try:
        saved = json.loads((Path(out) / RUN_CONFIG).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def config_diffs(out, current: dict) -> list[str]:
    """The settings that change what a resumed optimizer would do, as 'key: old → new'."""
    saved = _saved_config(out) or {}
    return [
        f"{k}: {saved.get(k)!r} → {current.get(k)!r}"
        for k in RESUME_KEYS
        if k in saved and k in current and saved.get(k) != current.get(k)
    ]


def check_resume_config(out, current: dict, allow_change: bool) -> None:
    """Refuse to resume with a different LR / γ / grouping (PyTorch would silently keep the old group LRs)."""
    diffs = config_diffs(out, current)
    if diffs and not allow_change:
        raise UsageError(
            "--resume with a different configuration than the checkpoint's run "
            f"({'; '.join(diffs)}); the resumed optimizer would keep its old "
            "per-group LRs. Resume with the original values, or pass "
            "--allow-config-change to apply the new ones"
        )


def write_run_config(out, current: dict, *, resume: bool) -> None:
    """run_config.json: the resolved configuration. A resume that changed settings (--allow-config-change) records
    the new ones and keeps the replaced ones, oldest first, under "history"."""
    path = Path(out) / RUN_CONFIG
    saved = _saved_config(out) if resume else None
    if saved is None:
        write_json(path, current)
        return
    old = {k: v for k, v in saved.items() if k != "history"}
    if not config_diffs(out, current):
        return
    write_json(path, {**current, "history": list(saved.get("history") or []) + [old]})


def _json_safe(obj):
    """NaN/inf are not JSON: they become null (the records keep the numbers that exist)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def write_json(path: Path, data) -> None:
    """Write JSON atomically (temp file + rename); non-finite numbers are written as null."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_json_safe(data), indent=2, default=str, allow_nan=False) + "\n")
    os.replace(tmp, path)


def nonfinite_parameters(model, limit: int = 3) -> list[str]:
    """Names of (at most `limit`) parameters holding NaN/inf; one device sync per device when all are finite.

    Under torch.distributed every rank must call it: a sharded model (FSDP2's DTensors, ZeRO-3) holds different
    values on each rank, so the ranks agree on the answer (one all-reduce), or one rank would stop while the others
    wait for it in the next collective."""
    import torch

    def all_finite(t):  # in chunks: the temporary mask stays small even for a huge embedding matrix
        parts = [torch.isfinite(c).all() for c in t.reshape(-1).split(1 << 24)]
        return parts[0] if len(parts) == 1 else torch.stack(parts).all()

    named = [(n, p.to_local() if hasattr(p, "to_local") else p) for n, p in model.named_parameters()]
    named = [(n, p.detach()) for n, p in named if p.numel() and p.dtype.is_floating_point]
    by_device: dict = {}
    with torch.no_grad():
        for _, p in named:
            by_device.setdefault(p.device, []).append(all_finite(p))
        finite = all(bool(torch.stack(flags).all()) for flags in by_device.values())
        if not max_over_ranks(int(not finite)):
            return []
        mine = [n for n, p in named if not bool(all_finite(p))][:limit]
        return mine or ["(a shard held by another rank)"]


def save_final(trainer_or_model, tokenizer, out: str) -> dict[str, int] | None:
    """Save model + tokenizer (safetensors) so that a crash mid-save never leaves a model that looks whole.
    Returns {file name: size} of what was moved in (rank 0; None elsewhere). Refuses weights holding NaN/inf.

    Call on every rank (FSDP/DeepSpeed gather weights collectively); only rank 0 writes and moves files."""
    from posttrainllm import outdir

    model = getattr(trainer_or_model, "model", trainer_or_model)
    bad = nonfinite_parameters(model)
    if bad:
        raise TrainingError(
            f"the trained weights hold NaN/inf values ({', '.join(bad)}, ...): no "
            "final model was written. Training diverged; try a lower --lr, a "
            "warmup (--warmup-ratio) or --precision fp32"
        )
    outp = Path(out)
    tmp = outp / outdir.HIDDEN / "final-tmp"
    if is_rank0() and tmp.exists():
        shutil.rmtree(tmp)
    if getattr(trainer_or_model, "is_fsdp_enabled", False):
        # the full weights, gathered on every rank, whatever the checkpoints' state-dict type (transformers' save_model
        # writes no weights at all under FSDP's SHARDED_STATE_DICT, accelerate's default)
        state_dict = trainer_or_model.accelerator.get_state_dict(trainer_or_model.model)
        trainer_or_model._save(str(tmp), state_dict=state_dict)
    elif hasattr(trainer_or_model, "save_model"):  # every rank: DeepSpeed gathers the weights collectively
        trainer_or_model.save_model(str(tmp))
    elif is_rank0():
        trainer_or_model.save_pretrained(str(tmp), safe_serialization=True)
    if not is_rank0():
        return None
    if not any(tmp.glob("*.safetensors")) and not any(tmp.glob("*.bin")):
        raise TrainingError(
            f"the final save wrote no model weights into {tmp}, so no final model "
            "was written (the checkpoints are kept). "
            "With DeepSpeed ZeRO-3, set stage3_gather_16bit_weights_on_model_save: true in its config"
        )
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    files = sorted(tmp.iterdir(), key=lambda f: (f.name in ("config.json", "adapter_config.json"), f.name))
    sizes = {f.name: f.stat().st_size for f in files if f.is_file()}
    outdir.own(outp, [f.name for f in files])  # recorded as ours before they land in the user's directory
    (outp / FINAL_MARKER).unlink(missing_ok=True)
    for f in files:  # weights first, config last
        target = outp / f.name
        if f.is_dir() and target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(f, target)
    tmp.rmdir()
    return sizes


class InterruptGuard:
    """Context manager: the first SIGTERM/SIGINT asks the trainer to checkpoint and stop; a second one aborts.

    SIGTERM repeated within `REPEAT_S` seconds of the first is the same request delivered twice, not a second one:
    a scheduler signals every process while the launcher passes the signal on too, and the kernel sends a worker
    its parent-death signal once per exiting thread of a killed launcher."""

    REPEAT_S = 2.0

    def __init__(self):
        self.signum: int | None = None
        self.from_other_rank = False  # the signal reached another rank, and this one stops with it
        self._first_at = 0.0
        self._old = {}

    def _handle(self, signum, frame):
        import time

        if self.from_other_rank:  # already stopping with another rank: this rank's own (first) signal changes nothing
            self.from_other_rank, self._first_at = False, time.monotonic()
            return
        if self.signum == signal.SIGTERM == signum and time.monotonic() - self._first_at < self.REPEAT_S:
            return
        if self.signum is not None:  # a second signal: stop now (the checkpoint being written gets no marker)
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            import sys

            sys.stderr.write(
                "error: stopped by a second SIGTERM; a checkpoint cut short has no "
                "COMPLETE marker and --resume skips it\n"
            )
            raise SystemExit(EXIT_SIGTERM)
        self.signum, self._first_at = signum, time.monotonic()

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False

    @property
    def exit_code(self) -> int:
        return EXIT_SIGINT if self.signum == signal.SIGINT else EXIT_SIGTERM


def make_callback(guard: InterruptGuard):
    """A TrainerCallback that checkpoints+stops on a signal and marks checkpoints complete after each save."""
    from transformers import TrainerCallback

    class SafetyCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            # under torch.distributed the ranks stop at the same step, even when the signal reached them on either
            # side of a step boundary (or reached only some of them): one all-reduce of a CPU scalar per step
            signum = max_over_ranks(guard.signum or 0)
            if signum:
                if guard.signum is None:
                    guard.signum, guard.from_other_rank = signum, True
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_save(self, args, state, control, **kwargs):
            _barrier()  # every rank has written its files (rng_state_<rank>.pth, shards) before they are listed
            if state.is_world_process_zero:
                ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if ckpt.is_dir():
                    write_json(ckpt / MARKER, {"step": state.global_step, "files": file_sizes(ckpt)})
            return control

    return SafetyCallback()


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
