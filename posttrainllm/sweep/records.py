"""What a sweep keeps between its runs, and how it knows a result is still the result of the current settings.

- A cell's identity (`cell_identity`) is its command line (less where the base's evaluation is cached, which
  changes no result) and what each of its inputs holds: the training, eval, held-out, replay and recipe files and
  the model, identified as `--resume` identifies them (posttrainllm/rundir/fingerprint.py). A file rewritten in
  place is another input: the cells that read it run again; the others are kept.
- The sweep's records in a cell's or a merge's folder (`sweep_cell.json`, `sweep_merge.json`) are recorded as
  posttrainllm's in that folder's manifest, so the `--overwrite` of a re-run replaces them with the rest.
- `--discard-weights` removes a measured cell's weights: the final ones and every checkpoint (weights and optimizer
  state); its records and numbers stay.
- results.json keeps every point it ever held: those not measured by this run with these settings and inputs are
  listed under "earlier" (not on the frontier).

Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from posttrainllm.commands.registry import to_config
from posttrainllm.errors import PosttrainError
from posttrainllm.rundir.fingerprint import identity, input_kinds
from posttrainllm.rundir.layout import checkpoint_dirs, own, sha256, write_json

CELL_RECORD = "sweep_cell.json"
MERGE_RECORD = "sweep_merge.json"
NOT_COMPARED = ("eval_cache", "output_dir")  # where a cell writes and caches: no part of what it reads
_NOT_WEIGHTS = frozenset({"training_args.bin"})


def read_record(path: Path) -> dict | None:
    """A JSON object the sweep wrote; None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_record(d: Path, name: str, data: dict) -> None:
    """Write one of the sweep's records into a run's folder, recorded there as posttrainllm's first."""
    own(d, [name])
    write_json(d / name, data)


def claim(d: Path, name: str) -> None:
    """A record an earlier version of the sweep wrote without recording it: recorded now, before an --overwrite."""
    if (d / name).is_file() and not (d / name).is_symlink():
        own(d, [name])


def cell_inputs(command: str, argv: list[str], memo: dict) -> dict:
    """Each input of a cell's command line (option name -> its identity: contents for local files and folders,
    None for a hub id); `memo` holds what this sweep run has read already (one model folder for every cell)."""
    try:
        values = to_config(command, list(argv[1:])).to_dict()
    except PosttrainError:  # not a valid cell: it fails when run, and is never found done
        return {"unreadable": True}
    found = {}
    for name, kind in input_kinds().items():
        if name in NOT_COMPARED or not values.get(name):
            continue
        key = json.dumps([kind, values[name]], default=str)
        if key not in memo:
            memo[key] = identity(kind, values[name])
        found[name] = memo[key]
    return found


def cell_identity(command: str, argv: list[str], memo: dict) -> dict:
    """{"fingerprint", "argv", "inputs"}: the cell is done when a finished run recorded the same fingerprint."""
    inputs = cell_inputs(command, argv, memo)
    blob = json.dumps({"argv": argv, "inputs": inputs}, sort_keys=True, default=str)
    return {"fingerprint": hashlib.sha256(blob.encode()).hexdigest()[:16], "argv": argv, "inputs": inputs}


def why_again(saved: dict | None, current: dict) -> str | None:
    """Why a cell that ran before runs again, in words (None when it never finished)."""
    if saved is None:
        return None
    settings = saved.get("settings")
    if not isinstance(settings, dict) or "inputs" not in settings:
        return "recorded by an earlier version of the sweep"
    if settings.get("argv") != current["argv"]:
        return "its settings changed"
    changed = [k for k in current["inputs"] if settings["inputs"].get(k) != current["inputs"][k]]
    changed += [k for k in settings["inputs"] if k not in current["inputs"]]
    if not changed:
        return "its settings changed"
    return "the contents of " + ", ".join("--" + k.replace("_", "-") for k in changed) + " changed"


def run_identity(cell_dir: Path) -> str | None:
    """What tells one training of a cell from another (its eval_results.json): merges of an earlier training of the
    cell are not merges of this one."""
    f = cell_dir / "eval_results.json"
    return sha256(f) if f.is_file() else None


def _weights_file(f: Path) -> bool:
    """A model's weights (model*.safetensors, adapter_model.*, pytorch_model*.bin, *.gguf) or their shard index."""
    name = f.name.removesuffix(".index.json")
    return f.is_file() and name not in _NOT_WEIGHTS and name.endswith((".safetensors", ".bin", ".gguf"))


def has_weights(cell_dir: Path) -> bool:
    return cell_dir.is_dir() and any(_weights_file(f) for f in cell_dir.iterdir() if not f.is_symlink())


def discard_weights(cell_dir: Path) -> None:
    """The cell's final weights and every checkpoint-N/ (weights and optimizer state); its records stay."""
    for ckpt in checkpoint_dirs(cell_dir):
        shutil.rmtree(ckpt, ignore_errors=True)
    for f in cell_dir.iterdir() if cell_dir.is_dir() else []:
        if not f.is_symlink() and _weights_file(f):
            f.unlink()


def discarded_message(cell_name: str, cell_dir: Path, alphas: list[float]) -> str:
    return (
        f"{cell_name}: merge α={','.join(f'{a:g}' for a in alphas)} needs the cell's weights, which --discard-weights "
        f"deleted; to get them back, delete {cell_dir} and run the sweep again (the cell is trained again; every "
        "point measured so far stays in results.json)"
    )


def earlier_points(previous: dict | None, current: list[dict]) -> list[dict]:
    """The points results.json held before (its cells and its earlier points) that this run did not measure with the
    same settings and inputs: kept, so no point is ever lost."""
    if previous is None:
        return []
    now = {(r.get("cell"), r.get("fingerprint")) for r in current}
    kept: dict[tuple, dict] = {}
    for r in [*_records(previous.get("cells")), *_records(previous.get("earlier"))]:
        key = (r.get("cell"), r.get("fingerprint"))
        if key not in now:
            kept.setdefault(key, r)
    return list(kept.values())


def _records(value) -> list[dict]:
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []
