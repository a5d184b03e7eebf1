"""The run directory's layout, as a leaf every room may import: file names, this process's rank, atomic JSON
records, and which checkpoints are there and complete. Imports no torch/transformers and no other project module.

A checkpoint counts as complete only once `checkpoint-N/COMPLETE` exists and every file it lists has the listed size
(written after transformers has finished the checkpoint; posttrainllm/rundir/signals.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

HIDDEN = ".posttrainllm"
MANIFEST = "manifest.json"
MARKER = "COMPLETE"
FINAL_MARKER = "training_complete.json"
RUN_CONFIG = "run_config.json"
PROBE = "forgetting_probe.jsonl"  # the forgetting probe's samples of the starting model (evaluate/probe.py)
SELF_REPLAY = "self_replay.jsonl"  # --self-replay: the samples of the starting model (posttrainllm/data/self_replay.py)
SELF_REPLAY_SETTINGS = "self_replay.json"  # ... and how they were drawn
CKPT_DIR = re.compile(r"^checkpoint-(\d+)$")
# records a run writes besides the model (run_config.json ... training_complete.json), always ours by name
OWN_RECORDS = frozenset(
    {
        RUN_CONFIG,
        "param_groups.json",
        "trainer_state.json",
        "eval_results.json",
        FINAL_MARKER,
        SELF_REPLAY,
        SELF_REPLAY_SETTINGS,
        PROBE,
    }
)


def is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


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


def manifest(out: Path) -> set[str]:
    """The top-level names recorded as written by posttrainllm (OUT/.posttrainllm/manifest.json)."""
    try:
        return set(json.loads((out / HIDDEN / MANIFEST).read_text()).get("files", []))
    except (OSError, ValueError, AttributeError):
        return set()


def own(out: str | Path, names) -> None:
    """Record top-level names as written by posttrainllm (call before writing them; rank 0)."""
    out = Path(out)
    listed = manifest(out)
    new = {str(n) for n in names} - listed
    if not new:
        return
    (out / HIDDEN).mkdir(parents=True, exist_ok=True)
    write_json(out / HIDDEN / MANIFEST, {"files": sorted(listed | new)})


def file_sizes(d: Path) -> dict[str, int]:
    """Every file under `d` (relative POSIX path -> size), the COMPLETE marker excepted."""
    return {
        f.relative_to(d).as_posix(): f.stat().st_size for f in sorted(d.rglob("*")) if f.is_file() and f.name != MARKER
    }


def listed_files_problem(d: Path, files, what: str) -> str | None:
    """Why the files a record lists (name -> size) do not match what `d` holds; None when they do."""
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
    return listed_files_problem(d, files, "COMPLETE marker")


def finished_run(out: Path) -> dict | None:
    """The training_complete.json of a finished run whose final files are all there (None otherwise)."""
    try:
        done = json.loads((Path(out) / FINAL_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(done, dict):
        return None
    if "files" in done and listed_files_problem(Path(out), done["files"], FINAL_MARKER):
        return None
    return done


def checkpoint_dirs(out) -> list[Path]:
    """checkpoint-N directories of `out`, oldest first (symbolic links left out: linked_checkpoints)."""
    p = Path(out)
    if not p.is_dir():
        return []
    found = [
        (int(m.group(1)), d) for d in p.iterdir() if (m := CKPT_DIR.match(d.name)) and d.is_dir() and not d.is_symlink()
    ]
    return [d for _, d in sorted(found)]


def linked_checkpoints(out) -> list[Path]:
    """checkpoint-N entries of `out` that are symbolic links (never resumed from: a link may point into another
    run, and replacing the output directory would not carry what it points to), oldest first."""
    p = Path(out)
    if not p.is_dir():
        return []
    found = [(int(m.group(1)), d) for d in p.iterdir() if (m := CKPT_DIR.match(d.name)) and d.is_symlink()]
    return [d for _, d in sorted(found)]


def checkpoint_step(d: Path) -> int:
    return int(CKPT_DIR.match(d.name).group(1))


def newest_good_checkpoint(out) -> Path | None:
    """`out`'s newest complete checkpoint, as a path under `out` as given (None when there is none)."""
    good = [d for d in checkpoint_dirs(out) if verify_checkpoint(d) is None]
    return Path(out) / good[-1].name if good else None


def sha256(path) -> str:
    """A file's SHA-256, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
