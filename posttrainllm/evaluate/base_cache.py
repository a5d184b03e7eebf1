"""The base model's held-out evaluation, computed once and reused by every model measured against it.

A frontier (a sweep, a merge sweep) measures many models against one base on the same held-out texts: each needs
the base's perplexity (the "before" of its forgetting report) and the base's next-token distribution at every
predicted position (for KL(base ‖ model)). Without a cache each cell runs the base again. With one, the base runs
once per text: its perplexity result and, per predicted position, its `top_k` most likely tokens with their
log-probabilities and the log of the probability left over (the tail) are written under the cache directory, and
every later model's KL is computed from them.

**The KL from the cache** splits each position's sum in two: the base's `top_k` most likely tokens S (exact), and
the rest T = V \\ S, estimated from `TAIL_SAMPLES` tokens v_j drawn from the base's own distribution over T (with
replacement, by a generator seeded once per entry, so an entry is the same every time it is recorded):

    KL(p ‖ q) ≈ Σ_{v ∈ S} p(v) (log p(v) − log q(v))  +  p(T) · (1/M) Σ_j (log p(v_j) − log q(v_j))  +  c · B

The middle term is an unbiased estimate of the tail's part. B is a control variate of mean 0: with r = q/p, the
draws' mean of r − 1 less its known value q(T)/p(T) − 1 (q(T) = 1 − Σ_{v∈S} q(v), from the model's own logits),
weighted by p(T), summed over the text's positions; c is its coefficient that minimizes the variance, estimated
over the whole text from the same draws and kept in [0, 1]. Where the two models are close (r near 1) c is near 1 and
the tail term becomes p(T)·E[r − 1 − log r] + p(T) − q(T), whose sampled part is second order (low variance); where
they are far apart (r heavy-tailed) c is near 0 and the plain estimate stands. Not a bound, as lumping the tail
into one outcome was (that read 10% low on SmolLM2, 3.7% on Gemma 3 and 42% on a tiny model); every model measured
against one entry sees the same draws, so models are compared on common numbers. A model's KL to the base itself is
exactly 0; with a vocabulary of at most `top_k` tokens the tail is empty and the KL exact. Measured against the
two-forward KL on both real models: within 0.16% (SmolLM2) and 0.04% (Gemma 3) (docs/performance.md, section 14).
`DEFAULT_TOP_K` = 256, `TAIL_SAMPLES` = 64: 320 entries (2.5 KiB) per position. tests/unit/evaluate/test_base_cache.py
checks the exact case and the estimate.

The cache key covers the base (the SHA-256 of every file it holds, read whole: `content_identity`, remembered per
file by size and modification time in the cache folder), the text (SHA-256),
the window length, k and this format's version: a changed text or base gets a new entry. Entries are written to a
temporary directory and renamed into place, so a reader never sees half an entry. Memory follows the batch: the
per-position arrays are appended to files as they are computed and read back memory-mapped.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from posttrainllm.errors import DataError

DEFAULT_TOP_K = 256  # the base's most likely tokens kept per position (exact part)
TAIL_SAMPLES = 64  # tokens drawn from the rest per position (the estimated part)
_SEED = 0  # the draws' generator, seeded once per entry
_VERSION = 3  # 3: windows start with the tokenizer's prefix; the tail estimated from samples
_IDX, _LOGP, _SIDX, _SLOGP = "topk_idx.bin", "topk_logp.bin", "tail_sample_idx.bin", "tail_sample_logp.bin"
_RESULT = "result.json"
_FILES = (_IDX, _LOGP, _SIDX, _SLOGP)
RECORDED = "recorded.jsonl"


_MEMO = "identities.json"  # file digests by (path, size, mtime): a base is read whole once, not on every run


def content_identity(spec: str, memo_dir=None) -> str | None:
    """The SHA-256 over every file a local model directory (or the file itself) holds, each read whole, names and
    sizes included (None for a hub id or a path that is not there). Two bases that differ in one byte of one tensor
    get two identities. Each file's digest is remembered in `memo_dir`/identities.json by path, size and
    modification time, so a base of 1 GB is read once."""
    from posttrainllm.rundir.layout import sha256

    path = Path(os.path.expanduser(spec))
    if not path.exists():
        return None
    memo_file = Path(memo_dir) / _MEMO if memo_dir is not None else None
    memo = _read_memo(memo_file)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not _skipped(p, path))
    h, changed = hashlib.sha256(), False
    for f in files:
        st = f.stat()
        key = f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
        if key not in memo:
            memo[key], changed = sha256(f), True
        h.update(f"{f.relative_to(path) if f != path else f.name}\0{st.st_size}\0{memo[key]}\0".encode())
    if changed and memo_file is not None:
        _write_memo(memo_file, memo)
    return h.hexdigest()


def _skipped(p: Path, root: Path) -> bool:
    """A run directory used as a base: its checkpoints, hidden files and run records are not the model."""
    from posttrainllm.rundir.layout import CKPT_DIR, OWN_RECORDS

    parts = p.relative_to(root).parts
    return any(x.startswith(".") or CKPT_DIR.match(x) for x in parts) or p.name in OWN_RECORDS


def _read_memo(memo_file) -> dict:
    try:
        memo = json.loads(memo_file.read_text()) if memo_file is not None and memo_file.is_file() else {}
    except (OSError, ValueError):
        return {}  # a damaged memo is only a slower start: every file is read again
    return memo if isinstance(memo, dict) else {}


def _write_memo(memo_file: Path, memo: dict) -> None:
    try:
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_file.with_name(f".{_MEMO}.{os.getpid()}")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, memo_file)
    except OSError:
        pass  # not remembered: the next run reads the files again


def base_identity(model_path: str, model, precision: str = "fp32", cache_dir=None) -> dict:
    """What identifies a base for the cache: what its directory (or file) holds, read whole (`content_identity`),
    the dtype it is scored in (the model given is the base, or one loaded the same way) and the autocast it is scored
    under (``precision``: evaluate/precision.py; a bf16 entry is never read by an fp32 evaluation, nor the other way
    round)."""
    from posttrainllm.evaluate.precision import AUTOCAST_DTYPES

    dtype = next((str(p.dtype) for p in model.parameters()), "?")
    identity = {"model": content_identity(model_path, cache_dir) or model_path, "dtype": dtype}
    if precision in AUTOCAST_DTYPES:  # fp32 keys stay as they were: entries recorded before this field still match
        identity["autocast"] = AUTOCAST_DTYPES[precision]
    return identity


def entry_key(base_identity, text_path: str, max_length: int, top_k: int) -> str:
    """The cache entry's name for one (base, text, window length, k)."""
    from posttrainllm.rundir.layout import sha256

    blob = json.dumps(
        {"base": base_identity, "text": sha256(text_path), "max_length": max_length, "k": top_k, "v": _VERSION},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class Recorder:
    """A KL tracker for `_score_batches` that scores nothing: run with the *base* as the model, it appends, for every
    predicted position, the base's top-k tokens with their log-probabilities and `TAIL_SAMPLES` tokens drawn from the
    rest (the tail) with their log-probabilities (module docstring) to files in `dest`."""

    def __init__(self, dest: Path, top_k: int, samples: int = TAIL_SAMPLES):
        self.dest, self.top_k, self.samples, self.positions = dest, top_k, samples, 0
        self.vocab: int | None = None
        self._generator = None

    def __enter__(self):
        import torch

        self._generator = torch.Generator().manual_seed(_SEED)
        self._stack = contextlib.ExitStack()
        self._files = [self._stack.enter_context(open(self.dest / n, "wb")) for n in _FILES]  # noqa: SIM115
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False

    def add(self, batch, logits, first: int = 1) -> None:
        import torch.nn.functional as F

        self.vocab = int(logits.shape[-1])
        for r in range(batch.shape[0]):
            logp = F.log_softmax(logits[r, first - 1 : -1].float(), dim=-1)
            arrays = top_and_tail(logp, self.top_k, self.samples, self._generator)
            for f, arr in zip(self._files, arrays):
                f.write(arr.contiguous().cpu().numpy().tobytes())
            self.positions += logp.shape[0]

    def result(self) -> dict:
        return {}


def top_and_tail(logp, top_k: int, samples: int, generator=None):
    """(top ids, their log-probabilities, tail sample ids, their log-probabilities) of each row of `logp` (T, V):
    the `top_k` most likely tokens, and `samples` tokens drawn with replacement from the distribution over the rest.
    With no tail (V <= top_k) no token is drawn."""
    import torch

    k = min(top_k, logp.shape[-1])
    top, idx = logp.topk(k, dim=-1)
    rest = logp.exp().scatter(-1, idx, 0.0)  # the tail's probabilities, the top's set to 0
    mass = rest.double().sum(-1)
    m = samples if k < logp.shape[-1] else 0
    if m:
        empty = mass <= 0
        rest[empty, idx[empty, 0]] = 1.0  # a row without tail mass draws anything: its tail term is p(T) · … = 0
        drawn = torch.multinomial(rest.cpu(), m, replacement=True, generator=generator).to(logp.device)
    else:
        drawn = torch.zeros((logp.shape[0], 0), dtype=torch.long, device=logp.device)
    return idx.to(torch.int32), top, drawn.to(torch.int32), logp.gather(-1, drawn)


class CachedKL:
    """A KL tracker for `_score_batches` reading the base's recorded top-k and tail samples from `src`: the running
    KL(base ‖ model), its tail estimated (module docstring), at the same positions, in the same order, as they were
    recorded."""

    def __init__(self, src: Path, meta: dict):
        import numpy as np

        self.k, self.m = meta["k"], meta["samples"]
        self.vocab, self.positions = meta["vocab"], meta["positions"]
        n = self.positions

        def arr(name, dtype, width):
            return np.memmap(src / name, dtype=dtype, mode="r", shape=(n, width)) if n and width else None

        self.idx, self.logp = arr(_IDX, np.int32, self.k), arr(_LOGP, np.float32, self.k)
        self.sidx, self.slogp = arr(_SIDX, np.int32, self.m), arr(_SLOGP, np.float32, self.m)
        self.at, self.total = 0, 0.0
        self.control, self.cov, self.var = 0.0, 0.0, 0.0  # the tail's control variate (module docstring)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add(self, batch, logits, first: int = 1) -> None:
        for r in range(batch.shape[0]):
            self.total += self._row(logits[r, first - 1 : -1])

    def _rows(self, array, sl, device, dtype):
        import torch

        return torch.from_numpy(array[sl].astype(dtype)).to(device)

    def _row(self, logits) -> float:
        import torch
        import torch.nn.functional as F

        n = logits.shape[0]
        if self.at + n > self.positions:
            raise DataError("the cached base evaluation has fewer positions than the text: the cache is stale")
        sl, dev = slice(self.at, self.at + n), logits.device
        self.at += n
        logq = F.log_softmax(logits[:, : self.vocab].float(), dim=-1)
        lp = self._rows(self.logp, sl, dev, "float64")
        lq_top = logq.gather(-1, self._rows(self.idx, sl, dev, "int64")).double()
        kl = (lp.exp() * (lp - lq_top)).sum(-1)
        if self.m:  # the tail (module docstring): p(T)·mean(−log r), and the control variate's sums
            p_tail = (1.0 - lp.exp().sum(-1)).clamp_min(0.0)  # both as 1 − the top's mass: equal for equal models
            q_tail = (1.0 - lq_top.exp().sum(-1)).clamp_min(0.0)
            log_r = logq.gather(-1, self._rows(self.sidx, sl, dev, "int64")).double()
            x = -(log_r - self._rows(self.slogp, sl, dev, "float64"))  # log p − log q at each draw
            y = (-x).exp() - 1.0  # r − 1: its mean over p(·|T) is q(T)/p(T) − 1, known
            y_mean = torch.where(p_tail > 0, q_tail / p_tail.clamp_min(1e-300) - 1.0, torch.zeros_like(p_tail))
            kl = kl + p_tail * x.mean(-1)
            self.control += float((p_tail * (y.mean(-1) - y_mean)).sum().item())
            xc, yc = x - x.mean(-1, keepdim=True), y - y.mean(-1, keepdim=True)
            self.cov += float((p_tail**2 * (xc * yc).mean(-1)).sum().item())
            self.var += float((p_tail**2 * (yc * yc).mean(-1)).sum().item())
        return float(kl.sum().item())

    def result(self) -> dict:
        if self.at != self.positions:
            raise DataError("the cached base evaluation has more positions than the text: the cache is stale")
        if not self.positions:
            return {}
        c = min(1.0, max(0.0, -self.cov / self.var)) if self.var > 0 else 0.0
        return {"kl": (self.total + c * self.control) / self.positions}


def lookup(cache_dir: Path, key: str) -> tuple[Path, dict] | None:
    """(entry directory, its meta) when the entry is complete and sound, else None. An entry whose meta cannot be
    read or whose files do not have the sizes the meta gives (truncated, edited) is named in one line on stderr and
    removed, so that it is recorded again."""
    entry = Path(cache_dir) / key
    meta_file = entry / _RESULT
    if not meta_file.is_file():
        if entry.exists() and not entry.is_dir():
            _discard(entry, "is not a folder")
        return None
    problem, meta = _entry_problem(entry, meta_file)
    if problem:
        _discard(entry, problem)
        return None
    return entry, meta


def _entry_problem(entry: Path, meta_file: Path) -> tuple[str | None, dict]:
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as e:
        return f"its {_RESULT} cannot be read ({type(e).__name__})", {}
    try:
        n, k, m = int(meta["positions"]), int(meta["k"]), int(meta["samples"])
        if not isinstance(meta["result"], dict) or meta.get("v") != _VERSION:
            raise ValueError
    except (KeyError, TypeError, ValueError):
        return f"its {_RESULT} is not this version's", {}
    sizes = {_IDX: 4 * n * k, _LOGP: 4 * n * k, _SIDX: 4 * n * m, _SLOGP: 4 * n * m}
    for name, size in sizes.items():
        f = entry / name
        if not f.is_file() or f.stat().st_size != size:
            return f"{name} is missing or not {size} bytes", {}
    return None, meta


def _discard(entry: Path, why: str) -> None:
    import sys

    print(f"eval cache: entry {entry} {why}: recording it again", file=sys.stderr)
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            entry.unlink()


def record(cache_dir: Path, key: str, top_k: int, score) -> tuple[Path, dict]:
    """Run `score(recorder)` (the base's `_score_batches` with the recorder as its KL tracker; it returns the base's
    result), then move the complete entry into place atomically. Returns (entry directory, meta)."""
    cache_dir = Path(cache_dir)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise DataError(
            f"--eval-cache {cache_dir} is not a folder: name a folder (it is created when missing)"
        ) from None
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_dir))
    try:
        rec = Recorder(tmp, top_k)
        result = score(rec)  # _score_batches enters and leaves the recorder
        meta = {"k": min(top_k, rec.vocab or top_k), "vocab": rec.vocab, "positions": rec.positions, "result": result}
        meta.update(samples=rec.samples if meta["k"] < (rec.vocab or 0) else 0, v=_VERSION)
        (tmp / _RESULT).write_text(json.dumps(meta))
        with open(cache_dir / RECORDED, "a") as log:  # one line per time the base was scored: what a frontier cost
            log.write(json.dumps({"key": key, "positions": rec.positions, "pid": os.getpid()}) + "\n")
        try:
            os.replace(tmp, cache_dir / key)
        except OSError:  # another process finished the same entry first: theirs is as good (if it is sound)
            if lookup(cache_dir, key) is None:
                os.replace(tmp, cache_dir / key)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    found = lookup(cache_dir, key)
    assert found is not None
    return found


def _entries(tokenizer, paths, max_length: int, batch_size: int, cache_dir, base_identity, top_k: int):
    """(name, path, key, batches(path)) of each text file, checked before anything is scored."""
    from posttrainllm.evaluate.files import _checked_file, _names_for_paths
    from posttrainllm.evaluate.scoring import _check_batch_size, _check_max_length
    from posttrainllm.evaluate.stream import file_chunks, text_batches

    max_length, batch_size = _check_max_length(max_length), _check_batch_size(batch_size)
    checked = [_checked_file(os.fspath(p)) for p in paths]

    def batches(path):  # (windows, prefix length)
        return text_batches(tokenizer, file_chunks(path), max_length, batch_size)

    for name, path in zip(_names_for_paths(checked, set()), checked):
        yield name, path, entry_key(base_identity, path, max_length, top_k), batches


def _record_pass(base, windows, recorder) -> dict:
    from posttrainllm.evaluate.scoring import _score_batches

    batches, prefix = windows
    return _score_batches(base, batches, None, kl=recorder, prefix=prefix)


def base_results(
    load_base,
    tokenizer,
    paths: list[str],
    max_length: int,
    *,
    cache_dir,
    base_identity,
    batch_size: int = 8,
    top_k: int = DEFAULT_TOP_K,
) -> dict:
    """The base's results for the text files `paths` (as `evaluate_files` gives them), from the cache; a text the
    cache does not hold yet is scored by the base (`load_base()`, called at most once) and recorded."""

    out, base = {}, None
    for name, path, key, batches in _entries(tokenizer, paths, max_length, batch_size, cache_dir, base_identity, top_k):
        found = lookup(cache_dir, key)
        if found is None:
            base = base if base is not None else load_base()
            found = record(cache_dir, key, top_k, functools.partial(_record_pass, base, batches(path)))
        out[name] = found[1]["result"]
    return out


def results_against_base(
    model,
    tokenizer,
    paths: list[str],
    max_length: int,
    *,
    cache_dir,
    base_identity,
    batch_size: int = 8,
    top_k: int = DEFAULT_TOP_K,
    progress=None,
) -> dict:
    """The model's results for the text files `paths`, each with "kl" = KL_k(base ‖ model) from the cached base
    (module docstring); `base_results` must have recorded them. The base does not run."""
    from posttrainllm.evaluate.scoring import _score_batches

    out = {}
    for name, path, key, batches in _entries(tokenizer, paths, max_length, batch_size, cache_dir, base_identity, top_k):
        found = lookup(cache_dir, key)
        if found is None:
            raise DataError(f"{path}: the base's evaluation is not in the cache {cache_dir}; record it first")
        windows, prefix = batches(path)
        out[name] = _score_batches(model, windows, progress, kl=CachedKL(*found), prefix=prefix)
    return out


def evaluate_against_base(model, tokenizer, paths: list[str], max_length: int, *, load_base, **kw) -> tuple[dict, dict]:
    """(base results, model results): `base_results` then `results_against_base`, the base run only for texts the
    cache does not hold yet."""
    progress = kw.pop("progress", None)
    before = base_results(load_base, tokenizer, paths, max_length, **kw)
    return before, results_against_base(model, tokenizer, paths, max_length, progress=progress, **kw)
