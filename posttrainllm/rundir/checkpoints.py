"""Nothing lost on a crash: complete-checkpoint markers, SIGTERM/SIGINT → checkpoint, atomic final save.

- A checkpoint counts as complete only once `checkpoint-N/COMPLETE` exists and what it lists is there: the marker
  is written by a callback after transformers has finished writing every file of the checkpoint (after a barrier
  under torchrun), and records each file's name and size. `--resume` verifies them and skips a checkpoint that
  fails (a half-written one, or one whose optimizer state or weights were removed since), saying why.
- SIGTERM/SIGINT during training (posttrainllm/rundir/signals.py): the current step finishes, a checkpoint is
  saved, the run exits with 143 (SIGTERM) or 130 (SIGINT) after printing the resume command.
- The final model is written to `OUT/.posttrainllm/final-tmp/`, its names recorded as posttrainllm's own
  (posttrainllm/rundir/outdir.py), then moved into `OUT/` with `config.json` last and `training_complete.json` (which
  lists the files and sizes) after it: a crash mid-save never leaves a directory that loads as a model. Weights
  holding NaN/inf are never saved, neither as a checkpoint nor as the final model.
- Output-directory ownership, locking and `--overwrite` live in posttrainllm/rundir/outdir.py.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from posttrainllm.distributed import max_over_ranks
from posttrainllm.errors import TrainingError, UsageError
from posttrainllm.rundir import fingerprint
from posttrainllm.rundir.layout import (
    FINAL_MARKER,
    HIDDEN,
    MARKER,
    RUN_CONFIG,
    checkpoint_dirs,
    file_sizes,
    is_rank0,
    linked_checkpoints,
    own,
    verify_checkpoint,
    write_json,
)


def resume_checkpoint(out) -> tuple[Path, list[tuple[Path, str]]]:
    """(newest complete checkpoint, [(checkpoint skipped, why)]): newer incomplete ones, and every symbolically
    linked one (never resumed from); UsageError when none is complete."""
    skipped = [(d, f"a symbolic link to {_link_target(d)}; only checkpoints written here are resumed from")
               for d in linked_checkpoints(out)]  # fmt: skip
    for d in reversed(checkpoint_dirs(out)):
        problem = verify_checkpoint(d)
        if problem is None:
            return d, skipped
        skipped.append((d, problem))
    extra = f" ({len(skipped)} checkpoint(s) skipped: {describe_skipped(skipped)})" if skipped else ""
    raise UsageError(f"--resume: no complete checkpoint in {out}{extra}")


def _link_target(d: Path) -> str:
    try:
        return str(os.readlink(d))
    except OSError:
        return "?"


def describe_skipped(skipped: list[tuple[Path, str]]) -> str:
    return "; ".join(f"{d.name} ({why})" for d, why in skipped)


def _saved_config(out) -> dict | None:
    try:
        saved = json.loads((Path(out) / RUN_CONFIG).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def config_diffs(out, current: dict, *, include_free: bool = False) -> list[tuple[str, str, str]]:
    """How the current run differs from the saved one (posttrainllm/rundir/fingerprint.py), as (field, old, new)."""
    saved = _saved_config(out)
    return [] if saved is None else fingerprint.differences(saved, current, include_free=include_free)


def asks_for_more(out, current: dict) -> bool:
    """A --resume of a finished run trains on only when a setting that shapes training, or --max-steps, changed
    (a new --logging-steps alone leaves the finished run as it is)."""
    return any(
        k not in fingerprint.FREE or k == "max_steps" for k, _, _ in config_diffs(out, current, include_free=True)
    )


def check_resume_config(out, current: dict, allow_change: bool) -> None:
    """Refuse to resume a different run: every setting that shapes training is compared (fingerprint.FREE lists the
    ones a resume may change); --allow-config-change accepts the new values and records the old as history."""
    diffs = config_diffs(out, current)
    if diffs and not allow_change:
        raise UsageError(
            f"--resume: this is not the run in {out} ({fingerprint.describe(diffs)}). Resume with the original "
            "settings, or pass --allow-config-change to continue with the new ones (the optimizer then takes the "
            'new LRs and hyperparameters, and run_config.json keeps the old values under "history")'
        )


def write_run_config(out, current: dict, *, resume: bool) -> None:
    """run_config.json: the resolved configuration. A resume that changed settings (--allow-config-change, or the
    free ones such as --max-steps) records the new ones and keeps the replaced ones, oldest first, under "history"."""
    path = Path(out) / RUN_CONFIG
    saved = _saved_config(out) if resume else None
    if saved is None:
        write_json(path, current)
        return
    if not fingerprint.differences(saved, current, include_free=True):
        return
    old = {k: v for k, v in saved.items() if k != "history"}
    write_json(path, {**current, "history": list(saved.get("history") or []) + [old]})


def nonfinite_parameters(model, limit: int = 3) -> list[str]:
    """Names of (at most `limit`) parameters holding NaN/inf; one device sync per device when all are finite.

    The common case (all finite) costs one read of the weights: a tensor's float32 sum is finite only if every
    element is (NaN and ±inf propagate through a sum). A sum that is not finite is checked element by element, so a
    sum that overflows (finite weights whose total exceeds float32's range) is not taken for a NaN. On SmolLM2-135M
    (one CPU thread) the sums take 44 ms where the element-wise masks took 510 ms.

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
            by_device.setdefault(p.device, []).append(p.sum(dtype=torch.float32))
        finite = all(bool(torch.isfinite(torch.stack(sums)).all()) for sums in by_device.values())
        if not finite:  # a NaN/inf, or only an overflowing sum: the exact check decides
            finite = all(bool(all_finite(p)) for _, p in named)
        if not max_over_ranks(int(not finite)):
            return []
        mine = [n for n, p in named if not bool(all_finite(p))][:limit]
        return mine or ["(a shard held by another rank)"]


def save_final(trainer_or_model, tokenizer, out: str) -> dict[str, int] | None:
    """Save model + tokenizer (safetensors) so that a crash mid-save never leaves a model that looks whole.
    Returns {file name: size} of what was moved in (rank 0; None elsewhere). Refuses weights holding NaN/inf.

    Call on every rank (FSDP/DeepSpeed gather weights collectively); only rank 0 writes and moves files."""
    model = getattr(trainer_or_model, "model", trainer_or_model)
    bad = nonfinite_parameters(model)
    if bad:
        raise TrainingError(
            f"the trained weights hold NaN/inf values ({', '.join(bad)}, ...): no "
            "final model was written. Training diverged; try a lower --lr, a "
            "warmup (--warmup-ratio) or --precision fp32"
        )
    outp = Path(out)
    tmp = outp / HIDDEN / "final-tmp"
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
    own(outp, [f.name for f in files])  # recorded as ours before they land in the user's directory
    (outp / FINAL_MARKER).unlink(missing_ok=True)
    for f in files:  # weights first, config last
        target = outp / f.name
        if f.is_dir() and target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(f, target)
    tmp.rmdir()
    return sizes


def checkpoint_bytes(out: Path, model) -> int:
    """About how many bytes a checkpoint of `model` in `out` takes: the newest complete one's size, else the
    weights plus two optimizer moments (AdamW) of every trainable tensor."""
    good = [d for d in checkpoint_dirs(out) if verify_checkpoint(d) is None]
    if good:
        return sum(file_sizes(good[-1]).values())
    params = list(model.parameters())
    return sum(p.numel() * p.element_size() for p in params) + sum(2 * p.numel() * 4 for p in params if p.requires_grad)


_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def disk_full_error(error: BaseException, ckpt: Path, needed: int) -> TrainingError | None:
    """The error to raise instead of `error` when saving checkpoint `ckpt` failed for want of space: an OSError
    with errno ENOSPC/EDQUOT (anywhere in its chain), or any other error (torch's writer raises a RuntimeError
    without errno) when the disk now has less free space than `needed` bytes. The half-written checkpoint (it has
    no COMPLETE marker) is removed to give the space back; older checkpoints are untouched. None: not a full disk."""
    chain, e = [], error
    while e is not None and len(chain) < 10:
        chain.append(e)
        e = e.__cause__ or e.__context__
    full = any(isinstance(e, OSError) and e.errno in _DISK_FULL for e in chain)
    try:
        free = shutil.disk_usage(ckpt.parent).free
    except OSError:
        free = None
    if not full and not (free is not None and free < needed):
        return None
    if is_rank0() and ckpt.is_dir() and not ckpt.is_symlink() and not (ckpt / MARKER).exists():
        shutil.rmtree(ckpt, ignore_errors=True)
    good = [d.name for d in checkpoint_dirs(ckpt.parent) if verify_checkpoint(d) is None]
    kept = f"the last good checkpoint, {good[-1]}, is kept" if good else "no earlier checkpoint exists"
    room = f", {free / 1e6:.0f} MB free" if free is not None else ""
    return TrainingError(
        f"No space left on device while saving {ckpt.name} (needs about {needed / 1e6:.0f} MB{room} in "
        f"{ckpt.parent}); {kept}: free some space (or --save-total-limit, another --output-dir) and re-run with "
        "--resume"
    )
