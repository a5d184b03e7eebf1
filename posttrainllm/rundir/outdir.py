"""The output directory is the user's: what posttrainllm may write, replace and remove there, and when.

- **Ownership.** posttrainllm only ever moves or removes what it wrote itself: its run records (`OWN_RECORDS`),
  `checkpoint-<N>` *directories*, its hidden folder `.posttrainllm/`, and the names listed in
  `.posttrainllm/manifest.json` (the final model and tokenizer files, pretrain's `tokenizer/`), which are recorded
  there *before* they are written. Symbolic links are never ours. Anything else makes `--overwrite` refuse (exit 2).
- **Lock.** A run holds an exclusive `fcntl.flock` on `.posttrainllm/lock` (which holds its PID, host and start
  time) from before it checks the directory until it exits; a second run into the same directory exits 2 at once,
  naming that PID. The kernel drops the lock when its process dies, so a lock left by a dead process is simply
  taken over (with a note). Under torchrun/accelerate only global rank 0 takes it.
- **`--overwrite` deletes nothing first.** Inputs inside the directory are refused; the previous contents stay
  untouched while the model and data load, then are moved (renamed, same filesystem) into
  `.posttrainllm/replaced-<k>/` just before the new run writes anything, and deleted only after the new run's final
  save succeeded. If the new run fails before saving a complete checkpoint, they are put back at once (or, after a
  hard kill, by the next run in the directory); if it saved one (an interrupt, a divergence), both are kept and the
  message says where.
- **Records are not a run.** A directory holding only pre-training records (`run_config.json`,
  `param_groups.json`, pretrain's `tokenizer/`, --self-replay's samples) is what a failed start or a `--dry-run`
  leaves: the next plain run proceeds into it.

This module imports no torch/transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from posttrainllm.config.inputs import inside, local_inputs
from posttrainllm.errors import UsageError, shorten
from posttrainllm.rundir import checkpoints
from posttrainllm.rundir.layout import (
    CKPT_DIR,
    FINAL_MARKER,
    HIDDEN,
    MANIFEST,
    MARKER,
    OWN_RECORDS,
    PROBE,
    RUN_CONFIG,
    SELF_REPLAY,
    SELF_REPLAY_SETTINGS,
    finished_run,
    is_rank0,
    manifest,
    own,
)

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

LOCK_NAME = "lock"
SLOT_PREFIX = "replaced-"
SLOT_MANIFEST = ".posttrainllm-manifest.json"  # the replaced contents' own manifest, kept inside their slot
# what a run writes before its first training step: a directory holding only these is not a finished run
PRE_TRAINING = frozenset(
    {"run_config.json", "param_groups.json", "tokenizer", SELF_REPLAY, SELF_REPLAY_SETTINGS, PROBE}
)
_RECORD_LIMIT = 16 << 20  # a run_config.json is a few kB: a bigger one is read no further than this


def _note(text: str) -> None:
    from posttrainllm.reporting import banner

    banner.note(text)


# ------------------------------------------------------------------------------------------------------ ownership
def entries(out: Path) -> list[str]:
    return sorted(e.name for e in out.iterdir()) if out.is_dir() else []


def made_by_posttrainllm(out: Path) -> bool:
    """Whether the run in `out` is posttrainllm's: its hidden folder holds a manifest or moved-aside contents, or a
    run_config.json it wrote is there (a JSON object naming a training command). A directory another tool filled
    (transformers' `checkpoint-N/` and `trainer_state.json`, with neither) is the user's: nothing in it is taken for
    posttrainllm's, not even with an empty `.posttrainllm/` beside it."""
    hidden = out / HIDDEN
    if not hidden.is_symlink() and ((hidden / MANIFEST).is_file() or slots(out)):
        return True
    record = out / RUN_CONFIG
    if record.is_symlink() or not record.is_file():
        return False
    try:
        with open(record, "rb") as f:
            saved = json.loads(f.read(_RECORD_LIMIT + 1)[:_RECORD_LIMIT] or b"null")
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and saved.get("command") in RECORDING_COMMANDS


# the commands whose runs write run_config.json (those that train, through posttrainllm/lifecycle.py): a record that
# names another is not ours. A record names its command by name, so this is the one list of names outside the specs;
# tests/unit/config/test_command_spec.py checks it is exactly the specs that train.
RECORDING_COMMANDS = frozenset(
    {"pretrain", "sft", "dpo", "kto", "reward", "finetune", "grpo", "rloo", "distill", "sdft"}
)


def _is_ours(out: Path, name: str, listed: set[str], run: bool = True) -> bool:
    """Whether top-level entry `name` is posttrainllm's; `run`: the directory holds a posttrainllm run at all."""
    p = out / name
    if p.is_symlink():
        return False
    if name == HIDDEN or name in listed:
        return True
    if not run:
        return False
    if name in OWN_RECORDS:
        return True
    if name.endswith(".tmp") and (name[:-4] in OWN_RECORDS or name[:-4] in listed):
        return True  # a record whose atomic write was cut short
    return bool(CKPT_DIR.match(name)) and p.is_dir()


def foreign(out: Path) -> list[str]:
    """Top-level entries of `out` that posttrainllm did not write."""
    listed, run = manifest(out), made_by_posttrainllm(out)
    return [n for n in entries(out) if not _is_ours(out, n, listed, run)]


def another_tools_run(out: Path) -> list[str]:
    """The checkpoints and trainer records of a run posttrainllm did not make (empty when `out` holds none, or holds
    posttrainllm's run)."""
    if made_by_posttrainllm(out):
        return []
    return [n for n in entries(out) if (CKPT_DIR.match(n) and (out / n).is_dir()) or n in OWN_RECORDS]


def only_pre_training_records(out: Path) -> bool:
    """True when `out` holds nothing but what a run writes before its first step (a failed start or a dry run)."""
    if slots(out):
        return False
    listed, run = manifest(out), made_by_posttrainllm(out)
    names = [n for n in entries(out) if n != HIDDEN]
    return all(n.removesuffix(".tmp") in PRE_TRAINING and _is_ours(out, n, listed, run) for n in names)


def has_results(out: Path) -> bool:
    """A complete checkpoint or a finished final save: something a run produced that is worth keeping."""
    if (out / FINAL_MARKER).is_file():
        return True
    return any(CKPT_DIR.match(n) and (out / n / MARKER).is_file() for n in entries(out))


def slots(out: Path) -> list[Path]:
    hidden = out / HIDDEN
    if not hidden.is_dir():
        return []
    found = [
        (int(d.name[len(SLOT_PREFIX) :]), d)
        for d in hidden.iterdir()
        if d.name.startswith(SLOT_PREFIX) and d.name[len(SLOT_PREFIX) :].isdigit() and d.is_dir()
    ]
    return [d for _, d in sorted(found)]


def _inputs_inside(cfg: RunConfig, out: Path, *, only_ours: bool = False) -> list[str]:
    """The run's inputs (every option the table marks as one: models, data, reward code, the recipe, ...) that are
    the output directory or lie inside it; with only_ours, those that are it or lie inside an entry of posttrainllm's
    (what a resumed run may rewrite or remove: checkpoints, the final model's files, records)."""
    found = []
    real = os.path.realpath(out)
    listed, run = manifest(out), made_by_posttrainllm(out)
    for label, path in local_inputs(cfg):
        if not inside(path, str(out)):
            continue
        rel = os.path.relpath(os.path.realpath(path), real)
        top = rel.split(os.sep)[0]
        if not only_ours or rel == os.curdir or _is_ours(out, top, listed, run):
            found.append(shorten(label, 120))
    return found


def _refuse_inputs_inside(cfg: RunConfig, out: Path, *, only_ours: bool = False) -> None:
    found = _inputs_inside(cfg, out, only_ours=only_ours)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        how = "this run would rewrite"
        if cfg.overwrite or cfg.resume:
            how = "--overwrite would replace" if cfg.overwrite else "--resume would rewrite"
        raise UsageError(
            f"{found[0]}{more} is inside --output-dir {cfg.output_dir}: {how} what this run reads; choose another "
            "--output-dir (or copy the input elsewhere first)"
        )


def _refuse_another_tools_run(out: Path, label: str) -> None:
    theirs = another_tools_run(out)
    if not theirs:
        return
    ckpts = sorted((n for n in theirs if CKPT_DIR.match(n)), key=lambda n: int(CKPT_DIR.match(n).group(1)))
    start = f", or start from it with --model {shorten(str(Path(label) / ckpts[-1]), 120)}" if ckpts else ""
    raise UsageError(
        f"--output-dir {label} holds a run posttrainllm did not make ({', '.join(shorten(n, 40) for n in theirs[:4])}"
        f"{', ...' if len(theirs) > 4 else ''}; none of posttrainllm's records): it is neither "
        f"resumed nor replaced; choose another --output-dir{start}"
    )


# ----------------------------------------------------------------------------------------------------------- lock
class Lock:
    """An exclusive flock on OUT/.posttrainllm/lock holding {pid, host, started}; removed when released."""

    def __init__(self, out: Path):
        self.path = out / HIDDEN / LOCK_NAME
        self.fd: int | None = None

    @staticmethod
    def describe(info: dict) -> str:
        started = info.get("started")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
        return f"PID {info.get('pid', '?')} on {info.get('host', '?')}, started {when}"

    def _read(self, fd: int) -> dict:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            data = json.loads(os.read(fd, 4096).decode("utf-8", "replace") or "{}")
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def acquire(self, out_label: str) -> str | None:
        """Take the lock or raise UsageError naming the holder. Returns a note when a dead run's lock was taken over."""
        import fcntl

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--output-dir {out_label} is not writable: {e.strerror or e}") from None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise UsageError(f"--output-dir {out_label} is not writable: {e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._read(fd)
                os.close(fd)
                raise UsageError(
                    f"--output-dir {out_label} is in use by another posttrainllm run ({self.describe(holder)}); "
                    "wait for it to finish or choose another --output-dir"
                ) from None
            try:  # the holder may have removed the file between our open and our flock: lock the current file
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            break
        previous = self._read(fd)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}).encode())
        os.fsync(fd)
        self.fd = fd
        if previous.get("pid") and previous.get("pid") != os.getpid():
            return f"took over the lock of a run that is no longer running ({self.describe(previous)})"
        return None

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # unlink while still holding it (see acquire's inode check)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


# ------------------------------------------------------------------------------------------------ replace / restore
def _move_contents(src: Path, dst: Path, names: list[str]) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        os.rename(src / name, dst / name)


def _restore(out: Path, slot: Path) -> bool:
    """Put the contents of `slot` back into `out`, removing the unfinished run's own entries. False if unsafe."""
    if foreign(out):
        return False  # something not ours appeared at the top: leave everything as it is
    for name in entries(out):
        if name == HIDDEN:
            continue
        p = out / name
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    mf = out / HIDDEN / MANIFEST
    mf.unlink(missing_ok=True)
    names = [n for n in entries(slot) if n != SLOT_MANIFEST]
    _move_contents(slot, out, names)
    if (slot / SLOT_MANIFEST).is_file():
        os.replace(slot / SLOT_MANIFEST, mf)
    slot.rmdir()
    return True


def needs_recovery(out: Path) -> bool:
    """An --overwrite run moved the previous contents aside and died before producing anything to keep."""
    return bool(slots(out)) and not has_results(out)


def recover(out: Path) -> str | None:
    restored = False
    while needs_recovery(out):
        if not _restore(out, slots(out)[-1]):
            break
        restored = True
    if restored:
        return f"restored the previous contents of {out}, which an unfinished --overwrite run had moved aside"
    return None


# ------------------------------------------------------------------------------------------------------- the run
class RunDir:
    """The output directory of one run: locked (rank 0) from prepare() until the `with` block ends.

    start(): just before the run writes anything, --overwrite moves the previous contents aside.
    finish(): after the final save, the moved-aside contents are deleted.
    On an exception/exit in between, they are restored if the new run saved no complete checkpoint, else kept.
    """

    def __init__(self, out: Path, label: str, *, overwrite: bool, created: bool, lock: Lock | None):
        self.path, self.label, self.overwrite, self.created, self.lock = out, label, overwrite, created, lock
        self.slot: Path | None = None
        self.finished = False

    @property
    def rank0(self) -> bool:
        return self.lock is not None

    def start(self) -> None:
        if not self.rank0 or not self.overwrite:
            return
        names = [n for n in entries(self.path) if n != HIDDEN]
        if not names:
            return
        existing = slots(self.path)
        k = int(existing[-1].name[len(SLOT_PREFIX) :]) + 1 if existing else 1
        slot = self.path / HIDDEN / f"{SLOT_PREFIX}{k}"
        slot.mkdir(parents=True)
        if (self.path / HIDDEN / MANIFEST).is_file():
            os.replace(self.path / HIDDEN / MANIFEST, slot / SLOT_MANIFEST)
        _move_contents(self.path, slot, names)
        self.slot = slot

    def own(self, names) -> None:
        if self.rank0:
            own(self.path, names)

    def finish(self) -> None:
        """The new run's final save is complete: the contents it replaced can go."""
        self.finished = True
        if not self.rank0:
            return
        for slot in slots(self.path):
            shutil.rmtree(slot, ignore_errors=True)

    def _after_failure(self) -> None:
        slot = f"{self.label}/{HIDDEN}/{self.slot.name}" if self.slot else ""
        if needs_recovery(self.path) and recover(self.path):
            _note(f"this run saved no checkpoint, so the previous contents of {self.label} were put back as they were")
            return
        if slots(self.path):
            _note(
                f"the previous contents of {self.label} (moved aside by --overwrite) "
                f"are kept in {slot or self.label + '/' + HIDDEN}; "
                "they are deleted when a run in this directory finishes (e.g. with "
                "--resume). To get them back instead, "
                f"delete this run's files from {self.label} and move them back"
            )

    def release(self) -> None:
        if self.lock is None:
            return
        self.lock.release()
        for p in (self.path / HIDDEN, self.path if self.created else None):
            if p is not None:
                try:
                    p.rmdir()  # only when empty
                except OSError:
                    pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is not None and not self.finished and self.rank0 and slots(self.path):
                interrupted_ok = exc_type is SystemExit and getattr(exc, "code", 1) in (0, None)
                if not interrupted_ok:
                    self._after_failure()
        finally:
            self.release()
        return False


def _check(cfg: RunConfig, out: Path) -> bool:
    """Read-only checks. True: go on; False: a --resume of a finished run (nothing to do). Raises UsageError."""
    label = cfg.output_dir
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output-dir {label} is a file")
    names = entries(out)
    _refuse_another_tools_run(out, label)
    if cfg.resume:
        if not names:
            raise UsageError(f"--resume: {label} has no checkpoints to resume from")
        _refuse_inputs_inside(cfg, out, only_ours=True)
        if finished_run(out) and not checkpoints.asks_for_more(out, cfg.to_dict()):
            return False  # finished, and nothing asks for more: leave it exactly as it is
        checkpoints.check_resume_config(out, cfg.to_dict(), cfg.allow_config_change)
        checkpoints.resume_checkpoint(out)
        return True
    if not names:
        return True
    if cfg.overwrite:
        _refuse_inputs_inside(cfg, out)
        strangers = foreign(out)
        if strangers:
            more = f" (and {len(strangers) - 1} more)" if len(strangers) > 1 else ""
            raise UsageError(
                f"--output-dir {label} holds {shorten(strangers[0], 80)}{more}, which "
                "posttrainllm did not write; --overwrite only "
                "replaces a previous run's own files: move it elsewhere or choose another --output-dir"
            )
        return True
    _refuse_inputs_inside(cfg, out, only_ours=True)
    if only_pre_training_records(out):
        return True  # a failed start or a dry run left only its records: not a finished run
    strangers = foreign(out)
    if strangers:
        raise UsageError(
            f"--output-dir {label} is not empty and holds "
            f"{shorten(strangers[0], 80)}, which posttrainllm did not write; choose "
            "another --output-dir"
        )
    kept = (
        f" (what an unfinished --overwrite run replaced is kept in {label}/{HIDDEN}/{slots(out)[-1].name})"
        if slots(out)
        else ""
    )
    if "resume" not in cfg.names:  # a command that is never resumed (merge): what is there is redone, not continued
        raise UsageError(
            f"--output-dir {label} is not empty (an earlier run's files, finished or cut short); pass --overwrite to "
            f"replace them, or choose another --output-dir{kept}"
        )
    raise UsageError(
        f"--output-dir {label} is not empty; pass --overwrite to replace it or --resume to continue its run{kept}"
    )


def prepare(cfg: RunConfig) -> RunDir | None:
    """Check the output directory, take its lock (rank 0) and re-check under it. None: nothing to do (finished run
    resumed). Every refusal is a UsageError (exit 2) raised before any model or data is loaded."""
    out = Path(cfg.output_dir).expanduser()
    label = cfg.output_dir
    if not is_rank0():  # other ranks only read; rank 0 locks, moves and writes
        return RunDir(out, label, overwrite=cfg.overwrite, created=False, lock=None) if _check(cfg, out) else None
    recovering = needs_recovery(out)
    if not recovering and not _check(cfg, out):
        return None  # read-only: a finished run's directory is not touched
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--output-dir {label} cannot be created: {e.strerror or e}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"--output-dir {label} is not writable")
    lock = Lock(out)
    run_dir = RunDir(out, label, overwrite=cfg.overwrite, created=created, lock=lock)
    try:
        note = lock.acquire(label)
        if note:
            _note(note)
        restored = recover(out)
        if restored:
            _note(restored)
        go_on = _check(cfg, out)  # again, under the lock: another run may have finished or started meanwhile
    except BaseException:
        run_dir.release()
        raise
    if not go_on:
        run_dir.release()
        return None
    return run_dir
