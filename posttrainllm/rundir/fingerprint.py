"""What makes a resumed run "the same run": every setting that shapes training, compared as a whole.

The run's options (RunConfig.to_dict()) are all compared, except the few a resumed run may change (`FREE`: when
it stops, saves, logs and evaluates, and where it reports). A new option is therefore compared without anyone
adding it to a list. Some settings are compared as what they resolve to rather than as typed:

- layer decay: the γ actually used (`--llrd G`, or the γ that `--llrd-bottom-scale S` gives on the model's blocks),
  so `--llrd-bottom-scale 0.5` and the equal `--llrd 0.7937` on a 4-block model are the same run (γ within 1e-5
  relative), and a different bottom scale is a different γ;
- inputs (`--model`, `--ref-model`, `--dataset`, `--eval-dataset`, `--replay-dataset`): for local ones, what is
  there (a file's size and SHA-256, or its size and mtime beyond 512 MiB; a directory's file names and sizes plus
  the SHA-256 of its small files, leaving out checkpoints, run records, cards and plots). The same path with other
  contents is refused; the same contents under another path (a relative path, a moved file) are the same input.
  Hub ids compare as typed;
- `--trainer-arg` / `--model-arg` values: compared as the values they coerce to ("0.5" equals 0.5).

run_config.json keeps what a run resolved under "resolved" (`resolved_record`). Imports no torch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from pathlib import Path

from posttrainllm.rundir.layout import CKPT_DIR, OWN_RECORDS, sha256

# Settings a resumed run may change (docs/reliability.md, "Interrupt and resume"): how long it runs, how often it
# saves, logs and evaluates, where it reports, and run-time details that do not change what is trained.
FREE = frozenset(
    {
        "max_steps",
        "save_steps",
        "save_total_limit",
        "logging_steps",
        "eval_steps",
        "report_to",
        "ood_eval",
        "output_dir",
        "dataset_num_proc",
        "ddp_timeout",
        "allow_new_weights",  # a permission for the first load; a resume starts from the checkpoint's weights
    }
)
INPUTS = ("model", "ref_model", "dataset", "eval_dataset", "replay_dataset")
GAMMA_KEYS = ("llrd", "llrd_bottom_scale")
COERCED = ("trainer_args", "model_args")
RESOLVED = "resolved"
_NOT_COMPARED = frozenset({RESOLVED, "history", "llrd_gamma_from_bottom_scale", "model_source", "ref_model_source"})
_HASH_LIMIT = 512 << 20  # files up to this size are hashed; larger ones are identified by size and mtime
_SMALL_IN_DIR = 1 << 20  # in a directory, files up to this size are hashed (configs, dataset_info, state.json)
_DIR_FILES = 10_000
_NOT_CONTENT = (".md", ".png", ".log", ".lock", ".tmp")


def input_identity(spec) -> dict | None:
    """What a local input path holds (None for a hub id or a path that is not there)."""
    if not isinstance(spec, str) or not spec:
        return None
    path = Path(spec).expanduser()
    try:
        st = path.stat()
    except (OSError, ValueError):
        return None
    if path.is_file():
        return _file_identity(str(path.resolve()), st.st_size, st.st_mtime_ns)
    if path.is_dir():
        return _dir_identity(path)
    return None


@functools.lru_cache(maxsize=64)
def _file_identity(path: str, size: int, mtime_ns: int) -> dict:
    if size > _HASH_LIMIT:
        return {"size": size, "mtime_ns": mtime_ns}
    return {"size": size, "sha256": sha256(path)}


def _dir_identity(path: Path) -> dict:
    h, files, size = hashlib.sha256(), 0, 0
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not CKPT_DIR.match(d))
        for name in sorted(names):
            if name.startswith(".") or name in OWN_RECORDS or name.endswith(_NOT_CONTENT):
                continue  # a run directory used as --model: its records, card and plots are not the model
            p = Path(root) / name
            try:
                st = p.stat()
            except OSError:
                continue
            files += 1
            if files > _DIR_FILES:
                break
            size += st.st_size
            h.update(f"{p.relative_to(path)}\0{st.st_size}\0".encode())
            if st.st_size <= _SMALL_IN_DIR and p.is_file():
                h.update(sha256(p).encode())
    return {"files": files, "size": size, "listing_sha256": h.hexdigest()}


def resolved_record(cfg_dict: dict, gamma: float | None = None, num_blocks: int | None = None) -> dict:
    """What run_config.json records under "resolved": the γ used, the block count and each input's identity."""
    rec: dict = {"inputs": {k: input_identity(cfg_dict.get(k)) for k in INPUTS if cfg_dict.get(k)}}
    if gamma is not None:
        rec["llrd_gamma"] = gamma
    if num_blocks is not None:
        rec["num_blocks"] = num_blocks
    return rec


def _gamma_used(cfg: dict, num_blocks: int | None) -> float | None:
    """The γ a configuration trains with; None when it rests on a block count that is not known."""
    scale = cfg.get("llrd_bottom_scale")
    if scale:
        if not num_blocks:
            return None
        return 1.0 if num_blocks <= 1 else float(scale) ** (1.0 / (num_blocks - 1))
    gamma = cfg.get("llrd")
    return 1.0 if gamma is None else float(gamma)


def _canonical(value):
    """The value as run_config.json stores it (tuples as lists, NaN as null), strings read as the scalars they
    spell, so a coerced trainer arg equals its text."""
    value = json.loads(json.dumps(value, default=str))

    def read(v):
        if isinstance(v, dict):
            return {k: read(x) for k, x in v.items()}
        if isinstance(v, list):
            return [read(x) for x in v]
        if isinstance(v, str):
            try:
                parsed = json.loads(v.strip().lower() if v.strip().lower() in ("true", "false", "null") else v)
            except ValueError:
                return v
            return parsed if isinstance(parsed, (int, float, bool)) or parsed is None else v
        return v

    return read(value)


def differences(saved: dict, current: dict, *, include_free: bool = False) -> list[tuple[str, str, str]]:
    """(field, old, new) as text, for each setting that differs between a saved run_config.json and the current
    run's options; the `FREE` ones only with include_free."""
    diffs: list[tuple[str, str, str]] = []
    saved_res = saved.get(RESOLVED) if isinstance(saved.get(RESOLVED), dict) else {}
    for k in dict.fromkeys([*saved, *current]):
        if k in _NOT_COMPARED or k in GAMMA_KEYS or (k in FREE and not include_free):
            continue
        if k not in saved or k not in current:  # an option of another version of posttrainllm: nothing to compare
            continue
        if k in INPUTS and _same_local_input(saved_res, k, current[k]):
            continue  # the same contents, wherever the path now points from
        if _canonical(saved[k]) != _canonical(current[k]):
            diffs.append((k, _short(saved[k]), _short(current[k])))
    diffs += _gamma_difference(saved, current, saved_res.get("num_blocks"))
    diffs += _input_differences(saved_res.get("inputs"), current)
    return diffs


def _same_local_input(saved_res: dict, key: str, spec) -> bool:
    inputs = saved_res.get("inputs")
    old = inputs.get(key) if isinstance(inputs, dict) else None
    return isinstance(old, dict) and input_identity(spec) == old


def _gamma_difference(saved: dict, current: dict, num_blocks) -> list[tuple[str, str, str]]:
    old, new = _gamma_used(saved, num_blocks), _gamma_used(current, num_blocks)
    if old is None:
        old = saved.get("llrd_gamma_from_bottom_scale")  # what runs of earlier versions recorded
    if old is None or new is None:  # no block count recorded: compare the options as typed
        return [(k, _short(saved.get(k)), _short(current.get(k))) for k in GAMMA_KEYS if saved.get(k) != current.get(k)]
    if math.isclose(old, new, rel_tol=1e-5):
        return []

    def how(cfg: dict) -> str:
        scale = cfg.get("llrd_bottom_scale")
        return f" (--llrd-bottom-scale {scale:g} on {num_blocks} blocks)" if scale and num_blocks else ""

    return [("llrd (γ used)", f"{old:.6g}{how(saved)}", f"{new:.6g}{how(current)}")]


def _input_differences(saved_inputs, current: dict) -> list[tuple[str, str, str]]:
    if not isinstance(saved_inputs, dict):
        return []
    diffs = []
    for k, old in saved_inputs.items():
        spec = current.get(k)
        if not isinstance(old, dict) or not spec:
            continue
        new = input_identity(spec)
        if new != old:
            diffs.append((f"{k} contents", _describe(old), _describe(new) if new else "not there"))
    return diffs


def _describe(identity: dict) -> str:
    digest = identity.get("sha256") or identity.get("listing_sha256")
    parts = [f"{identity.get('size', '?'):,} bytes"]
    if "files" in identity:
        parts.insert(0, f"{identity['files']} files")
    parts.append(f"sha256 {digest[:12]}" if digest else f"mtime {identity.get('mtime_ns')}")
    return ", ".join(parts)


def describe(diffs: list[tuple[str, str, str]]) -> str:
    return "; ".join(f"{k}: {old} → {new}" for k, old, new in diffs)


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
