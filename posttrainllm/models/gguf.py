"""GGUF files as a model source: find the file, read what it holds, convert it once into an ordinary model directory.

transformers reads a GGUF file (`from_pretrained(dir, gguf_file=NAME)`) and dequantizes its weights, but refuses to
`save_pretrained` such a model. So a GGUF source is converted once, into a cached directory of safetensors weights
(fp32, dequantized), config and tokenizer, and every command then loads that directory like any other model
(at the run's precision). The directory also records where it came from (`gguf_source.json`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from posttrainllm.errors import ModelError, UsageError, one_line
from posttrainllm.rundir.layout import sha256  # noqa: F401  (gguf.sha256: bench/smollm2.py uses it)

MAGIC = b"GGUF"
SOURCE_FILE = "gguf_source.json"
CACHE_ENV = "POSTTRAINLLM_CACHE"
LOW_BITS = 4  # at this many nominal bits per weight or fewer, training starts from visible quantization error


def find_gguf(ref: str, what: str = "--model") -> Path | None:
    """The GGUF file `ref` names: a `.gguf` file, or a directory without config.json holding exactly one. None when
    `ref` is not a GGUF source (a model directory, a hub id)."""
    p = Path(ref).expanduser()
    if p.is_file():
        return p if p.suffix.lower() == ".gguf" or _has_magic(p) else None
    if p.is_dir() and not (p / "config.json").is_file():
        files = sorted(f for f in p.glob("*.gguf") if f.is_file())
        if len(files) > 1:
            names = ", ".join(f.name for f in files[:5]) + (" ..." if len(files) > 5 else "")
            raise UsageError(f"{what} {ref} holds {len(files)} GGUF files ({names}): pass the file to use")
        return files[0] if files else None
    return None


def _has_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def nominal_bits(type_name: str) -> float:
    """Bits per weight a GGUF tensor type is named for: Q4_1 → 4, Q8_0 → 8, IQ2_XS → 2, F16/BF16 → 16, F32 → 32,
    TQ1_0 → 1 (ternary)."""
    name = type_name.upper()
    if name in ("F32", "F64", "I32", "I64"):
        return 64.0 if name.endswith("64") else 32.0
    if name in ("F16", "BF16", "I16"):
        return 16.0
    if name == "I8":
        return 8.0
    m = re.match(r"(?:T?I?Q|MXFP|NVFP)(\d+)", name)  # MXFP4/NVFP4: 4-bit floats with a shared scale
    return float(m.group(1)) if m else 32.0


def inspect(path: Path, what: str = "--model") -> dict[str, Any]:
    """What the file holds, read from its header (memory-mapped, no weights loaded): architecture, the quantization
    type of most weight-matrix elements, its nominal bits, and the count of tensors per type. A file that is not GGUF,
    or an architecture transformers cannot read from GGUF, is a UsageError naming it and what to do."""
    if not _has_magic(path):
        raise UsageError(f"{what} {path}: not a GGUF file (it does not start with the GGUF magic bytes)")
    try:
        import gguf
    except ImportError:
        raise UsageError(
            f"{what} {path}: reading GGUF files needs the gguf package: pip install 'posttrainllm[gguf]'"
        ) from None
    try:
        reader = gguf.GGUFReader(str(path))
        arch = _field(reader, "general.architecture")
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt file
        raise UsageError(f"{what} {path}: cannot read the GGUF header ({one_line(e)})") from None
    counts: dict[str, int] = {}
    elements: dict[str, int] = {}
    for t in reader.tensors:
        name = t.tensor_type.name
        counts[name] = counts.get(name, 0) + 1
        if len(t.shape) >= 2:
            elements[name] = elements.get(name, 0) + int(t.n_elements)
    quant = max(elements, key=elements.get) if elements else (max(counts, key=counts.get) if counts else "F32")
    check_architecture(arch, path, what)
    total = sum(elements.values())
    shares = {k: v / total for k, v in sorted(elements.items(), key=lambda kv: -kv[1])} if total else {}
    # a mix (Q4_K_M: Q8_0 embeddings, Q5_0, Q4_K and Q6_K blocks): the fewest bits any 5% of the matrices has
    low = min((nominal_bits(k) for k, share in shares.items() if share >= 0.05), default=nominal_bits(quant))
    return {
        "file": str(path.resolve()),
        "architecture": arch,
        "quantization": quant,
        "bits": min(nominal_bits(quant), low),
        "matrix_types": {k: round(v, 4) for k, v in shares.items()},
        "tensor_types": dict(sorted(counts.items())),
        "name": _field(reader, "general.name"),
    }


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 - an unreadable field is simply absent
        return None


# llama.cpp's names for architectures that transformers lists under its own name (and renames when reading a file,
# modeling_gguf_pytorch_utils.load_gguf_checkpoint): a Qwen3-MoE GGUF says "qwen3moe", never "qwen3_moe"
LLAMA_CPP_NAMES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "t5encoder": "t5",
}


def check_architecture(arch: str | None, path: Path, what: str = "--model") -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    supported = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    if LLAMA_CPP_NAMES.get(arch, arch) not in supported:
        import transformers

        raise UsageError(
            f"{what} {path}: architecture {arch!r} cannot be read from GGUF by transformers {transformers.__version__} "
            f"(it reads {', '.join(supported)}); pass the original Hugging Face checkpoint (a directory or hub id)"
        )


def cache_root() -> Path:
    """Where converted GGUF sources are kept: $POSTTRAINLLM_CACHE/gguf, else ~/.cache/posttrainllm/gguf."""
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "posttrainllm")
    return Path(base) / "gguf"


def converted_dir(path: Path, root: Path | None = None) -> Path:
    """The cache directory of one GGUF file: named by the file and keyed by its path, size and modification time,
    so that a changed file is converted anew."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return (root or cache_root()) / f"{path.stem}-{key}"


# The fields `inspect` returns: a record that lacks one (written by an older version) is not used; a test checks
# that the record's answer equals `inspect`'s, so a field added there and not here fails it.
INFO_KEYS = ("file", "architecture", "quantization", "bits", "matrix_types", "tensor_types", "name")


def cached_inspect(path: Path, root: Path | None = None) -> dict[str, Any] | None:
    """What `inspect` said of `path` when it was converted, read from its cache directory's record (keyed by the
    file's path, size and modification time), or None when it has not been converted. Reading the header again costs
    seconds to tens of seconds on a large vocabulary (Gemma 3's 262k tokens are 262k header fields)."""
    record = read_source(converted_dir(path, root))
    if record is None or any(k not in record for k in INFO_KEYS):
        return None
    return {**{k: record[k] for k in INFO_KEYS}, "file": str(path.resolve())}


def read_source(model_dir: str | Path) -> dict[str, Any] | None:
    """The GGUF provenance a converted directory records, or None for any other model."""
    try:
        return json.loads((Path(model_dir) / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def convert(path: Path, info: dict[str, Any], root: Path | None = None, trust_remote_code: bool = False) -> Path:
    """The converted directory of `path` (safetensors fp32 weights, config without quantization_config, tokenizer
    and gguf_source.json), converting it when the cache does not hold it yet. Safe under several processes
    (torchrun ranks): one converts under a lock, the others wait and reuse; the directory appears complete or not
    at all."""
    out = converted_dir(path, root)
    if read_source(out) is not None:
        return out
    try:
        return _convert_into(out, path, info, trust_remote_code)
    except Exception as e:
        if isinstance(e, ModelError) or not _is_write_error(e):
            raise
        raise ModelError(
            f"cannot write the converted model of {path.name} to the cache {out.parent}: {one_line(e, 160)}; free "
            f"space there or set {CACHE_ENV} to a writable directory with room (about "
            f"{_size_text(int(path.stat().st_size * 32 / max(float(info.get('bits') or 32), 1.0)))}, fp32)"
        ) from e


def _is_write_error(e: BaseException) -> bool:
    """An error of writing the cache: an OSError (no space, read-only, permission, not a directory) or safetensors'
    writer's error."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - an older safetensors
        return isinstance(e, OSError)
    return isinstance(e, (OSError, SafetensorError))


def _size_text(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{max(1, n // 2**20)} MiB"


def _convert_into(out: Path, path: Path, info: dict[str, Any], trust_remote_code: bool) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with _lock(out.parent / f".{out.name}.lock"):
        if read_source(out) is not None:
            return out
        tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _write_converted(path, tmp, trust_remote_code)
            record = {**info, "sha256": sha256(path), "size": path.stat().st_size}
            (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            shutil.rmtree(out, ignore_errors=True)  # a directory without its record is an unfinished conversion
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_converted(path: Path, tmp: Path, trust_remote_code: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(gguf_file=path.name, trust_remote_code=trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kw)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kw)
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"cannot read the model in {path}: {one_line(e)}") from e
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized: what is saved is a plain model
    # transformers refuses save_pretrained on a GGUF-loaded model; a model built from the same config saves normally
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)
    plain.load_state_dict(loaded.state_dict(), assign=True, strict=False)
    plain.tie_weights()
    missing = [n for n, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise ModelError(f"cannot convert {path}: the file holds no weights for {', '.join(missing[:3])}")
    del loaded
    tmp.mkdir(parents=True)
    plain.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))


@contextlib.contextmanager
def _lock(lock_path: Path):
    import fcntl

    with open(lock_path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _kind(info: dict[str, Any]) -> str:
    """The quantization in words: its type, or the mix of the types that hold 5% or more of the weight matrices."""
    shares = {k: v for k, v in (info.get("matrix_types") or {}).items() if v >= 0.05}
    if len(shares) > 1:
        return " + ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items())
    return info["quantization"]


def describe(info: dict[str, Any]) -> str:
    """The banner's words for a GGUF source: `SmolLM2-135M-Instruct.Q4_1.gguf (GGUF, Q4_1, dequantized)`; a file
    whose weight matrices mix types names each that holds 5% or more of them: `(GGUF, Q8_0 63% + Q5_0 24% + Q4_K
    9%, dequantized)`."""
    return f"{Path(info['file']).name} (GGUF, {_kind(info)}, dequantized)"


def low_bit_note(info: dict[str, Any]) -> str | None:
    """The banner's warning when some weights have LOW_BITS or fewer (the fewest bits any 5% of the matrices has)."""
    if info.get("bits", 32) > LOW_BITS:
        return None
    kind = _kind(info)
    bits = f"{info['bits']:g} bits per weight" if kind == info["quantization"] else f"down to {info['bits']:g} bits"
    return (
        f"the weights come from a {kind} GGUF file ({bits}): training starts from their quantization error, and its "
        "first steps partly repair it (held-out perplexity may improve for that reason alone)"
    )
