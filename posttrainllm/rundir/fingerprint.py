"""What makes a resumed run "the same run": every setting that shapes training, compared as a whole.

The run's options (RunConfig.to_dict()) are all compared, except the few a resumed run may change (`FREE`: when
it stops, saves, logs and evaluates, and where it reports). A new option is therefore compared without anyone
adding it to a list. Some settings are compared as what they resolve to rather than as typed:

- layer decay: the γ actually used (`--llrd G`, or the γ that `--llrd-bottom-scale S` gives on the model's blocks),
  so `--llrd-bottom-scale 0.5` and the equal `--llrd 0.7937` on a 4-block model are the same run (γ within 1e-5
  relative), and a different bottom scale is a different γ;
- inputs (every option the table marks as one, `Opt.input`: `--model`, `--teacher`, `--ref-model`, the datasets,
  `--reward-fn` code, ...): for local ones, what is there. A file: its size and SHA-256 (size and mtime beyond
  512 MiB). A directory: its file names and sizes, the SHA-256 of its small files (configs, tokenizers) and of each
  bigger one (whole up to 64 MiB, e.g. a tokenizer.json; for weights and data shards, the header and 16 spread
  blocks), leaving out checkpoints, run records, cards and plots. A reward spec: its file, found as Python would
  import it, and its function's name. The same path with other contents is refused; the same contents under
  another path (`./rf.py` and `rf.py`, a moved file) are the same input. Hub ids and modules that are not found
  compare as typed;
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

from posttrainllm.config.inputs import code_file, entries, input_options
from posttrainllm.config.opt import CODE
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
        "eval_cache",
        "output_dir",
        "dataset_num_proc",
        "ddp_timeout",
        "allow_new_weights",  # a permission for the first load; a resume starts from the checkpoint's weights
        "forgetting_probe",  # measured after training: how many samples of the starting model
        "max_forgetting",  # applied after training: the merge back toward the starting model
    }
)
GAMMA_KEYS = ("llrd", "llrd_bottom_scale")
COERCED = ("trainer_args", "model_args")
RESOLVED = "resolved"
_NOT_COMPARED = frozenset({RESOLVED, "history", "llrd_gamma_from_bottom_scale", "model_source", "ref_model_source"})
_HASH_LIMIT = 512 << 20  # files up to this size are hashed; larger ones are identified by size and mtime
_SMALL_IN_DIR = 1 << 20  # in a directory, files up to this size are hashed (configs, dataset_info, state.json)
_DIR_FILES = 10_000
_NOT_CONTENT = (".md", ".png", ".log", ".lock", ".tmp")
_WHOLE_LIMIT = 64 << 20  # other big files in a directory (a tokenizer.json, a vocabulary) are hashed whole up to this
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".arrow", ".parquet")
_SAMPLES, _SAMPLE_BYTES = 16, 1 << 16  # a big file in a directory: 16 blocks of 64 KiB spread over it
_HEADER_LIMIT = 16 << 20  # a safetensors header (names, dtypes, shapes, offsets) is read whole up to this size


def input_kinds() -> dict[str, str]:
    """The input options (option name -> Opt.input kind), from the option table: a name reads the same kind of input
    in every command that has it (tests/unit/config/test_config.py checks), so a record needs no command's list."""
    return {o.name: o.input for o in input_options() if o.input}


def identity(kind: str | None, value):
    """What an input option's value reads: one identity (input_identity) for a path, one per entry for a repeatable
    option; for code, the file's identity and the function's name. None where nothing local is read (a hub id)."""
    if isinstance(value, (list, tuple)):
        return [identity(kind, v) for v in entries(value)]
    if kind != CODE:
        return input_identity(value)
    if not isinstance(value, str):
        return None
    path = code_file(value)
    found = input_identity(path) if path else None
    return {"code": found, "function": value.rpartition(":")[2]} if found else None


def _known(ident) -> bool:
    if isinstance(ident, list):
        return bool(ident) and all(_known(i) for i in ident)
    return isinstance(ident, dict)


def same_identity(old, new) -> bool:
    """`new` holds what `old` recorded (old records may hold fewer keys: those are the ones compared)."""
    if isinstance(old, list):
        return isinstance(new, list) and len(old) == len(new) and all(map(same_identity, old, new))
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and same_identity(v, new[k]) for k, v in old.items())
    return old == new


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
    h, big, files, size = hashlib.sha256(), hashlib.sha256(), 0, 0
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
            elif p.is_file():
                whole = st.st_size <= _WHOLE_LIMIT and not name.endswith(_WEIGHTS)
                digest = sha256(p) if whole else _sampled_sha256(p, st.st_size)
                big.update(f"{p.relative_to(path)}\0{digest}\0".encode())
    return {"files": files, "size": size, "listing_sha256": h.hexdigest(), "big_files_sha256": big.hexdigest()}


def _sampled_sha256(path: Path, size: int) -> str:
    """A big file's digest from its header (a .safetensors header whole: every tensor's name, dtype and shape) and
    16 blocks of 64 KiB spread evenly over it: other weights differ in them, and it reads about 1 MiB per file."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            h.update(head)
            if path.suffix == ".safetensors" and len(head) == 8:
                h.update(f.read(min(int.from_bytes(head, "little"), _HEADER_LIMIT)))
            for i in range(_SAMPLES):
                f.seek(max(0, size - _SAMPLE_BYTES) * i // (_SAMPLES - 1))
                h.update(f.read(_SAMPLE_BYTES))
    except OSError as e:
        h.update(f"unreadable: {e.errno}".encode())
    return h.hexdigest()


def resolved_record(cfg_dict: dict, gamma: float | None = None, num_blocks: int | None = None) -> dict:
    """What run_config.json records under "resolved": the γ used, the block count and each input's identity."""
    kinds = input_kinds()
    rec: dict = {
        "inputs": {k: identity(kind, cfg_dict[k]) for k, kind in kinds.items() if cfg_dict.get(k) and k not in FREE}
    }
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
    kinds = input_kinds()
    for k in dict.fromkeys([*saved, *current]):
        if k in _NOT_COMPARED or k in GAMMA_KEYS or (k in FREE and not include_free):
            continue
        if k not in saved or k not in current:  # an option of another version of posttrainllm: nothing to compare
            continue
        if k in kinds and _same_local_input(saved_res, k, kinds[k], current[k]):
            continue  # compared by contents, wherever the path now points from
        if _canonical(saved[k]) != _canonical(current[k]):
            diffs.append((k, _short(saved[k]), _short(current[k])))
    diffs += _gamma_difference(saved, current, saved_res.get("num_blocks"))
    diffs += _input_differences(saved_res.get("inputs"), current, kinds)
    return diffs


def _same_local_input(saved_res: dict, key: str, kind: str, spec) -> bool:
    """Both the saved and the current value read local files: they are compared by what those hold (the "contents"
    difference of _input_differences), not as typed."""
    inputs = saved_res.get("inputs")
    old = inputs.get(key) if isinstance(inputs, dict) else None
    return _known(old) and _known(identity(kind, spec))


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


def _input_differences(saved_inputs, current: dict, kinds: dict[str, str]) -> list[tuple[str, str, str]]:
    if not isinstance(saved_inputs, dict):
        return []
    diffs = []
    for k, old in saved_inputs.items():
        spec = current.get(k)
        if k in FREE or not spec or not (isinstance(old, dict) or (isinstance(old, list) and any(old))):
            continue
        new = identity(kinds.get(k), spec)
        if not same_identity(old, new):
            diffs.append((f"{k} contents", _describe(old), _describe(new)))
    return diffs


def _describe(ident) -> str:
    if isinstance(ident, list):
        return "[" + "; ".join(map(_describe, ident)) + "]"
    if not isinstance(ident, dict):
        return "not there"
    if "function" in ident:
        return f"{_describe(ident.get('code'))}, function {ident['function']}"
    digest = ident.get("sha256") or ident.get("listing_sha256")
    parts = [f"{ident.get('size', '?'):,} bytes"]
    if "files" in ident:
        parts.insert(0, f"{ident['files']} files")
    if ident.get("big_files_sha256"):
        parts.append(f"big files {ident['big_files_sha256'][:12]}")
    parts.append(f"sha256 {digest[:12]}" if digest else f"mtime {ident.get('mtime_ns')}")
    return ", ".join(parts)


def describe(diffs: list[tuple[str, str, str]]) -> str:
    return "; ".join(f"{k}: {old} → {new}" for k, old, new in diffs)


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
