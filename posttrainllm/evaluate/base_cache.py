"""The base model's held-out evaluation, computed once and reused by every model measured against it.

A frontier (a sweep, a merge sweep) measures many models against one base on the same held-out texts: each needs
the base's perplexity (the "before" of its forgetting report) and the base's next-token distribution at every
predicted position (for KL(base ‖ model)). Without a cache each cell runs the base again. With one, the base runs
once per text: its perplexity result and, per predicted position, its `top_k` most likely tokens with their
log-probabilities and the log of the probability left over (the tail) are written under the cache directory, and
every later model's KL is computed from them.

**The KL from the cache** is KL over the base's most likely tokens S_t at each position t plus one "tail" outcome
that lumps the rest:

    KL_S(p ‖ q) = Σ_{v ∈ S_t} p(v) (log p(v) − log q(v)) + p(T) (log p(T) − log q(T)),  T = V \\ S_t

where p(T) and q(T) are the base's and the model's probability of any token outside S_t. By the log-sum inequality
KL_S ≤ KL (grouping outcomes never raises a divergence); the gap is p(T) times the divergence *within* the tail.
So S_t is not a fixed top k: it is the base's smallest top-k set whose mass leaves at most `TAIL_MASS` (1e-4) of
the distribution outside, at least `MIN_K` and at most `top_k` (`MAX_K` = 8192) tokens. Where the tail is empty
(S_t = V) the KL is exact; where it holds at most 1e-4 of the base's mass the gap is at most 1e-4 times the
within-tail divergence, which measured under 1% of the KL on both real models (docs/performance.md). A position
where even `top_k` tokens leave more than `TAIL_MASS` outside is counted (``capped``) and the result then says
``kl_bound: true``: the figure is a lower bound, labelled so wherever it is printed.
tests/unit/evaluate/test_base_cache.py checks the exact case, the bound and the labels.

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

MAX_K = 8192  # most tokens kept at one position
DEFAULT_TOP_K = MAX_K
MIN_K = 16  # fewest tokens kept at one position
TAIL_MASS = 1e-4  # the base's probability left outside the kept tokens, at most (where MAX_K allows)
_VERSION = 2  # 2: windows start with the tokenizer's prefix; a kept set per position (counts.bin)
_IDX, _LOGP, _TAIL, _COUNT, _RESULT = "topk_idx.bin", "topk_logp.bin", "tail_logp.bin", "counts.bin", "result.json"
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
    predicted position, the base's kept tokens (module docstring) with their log-probabilities, how many it kept and
    the log-probability of the rest (the tail) to files in `dest`."""

    def __init__(self, dest: Path, top_k: int, tail_mass: float = TAIL_MASS):
        self.dest, self.top_k, self.tail_mass, self.positions = dest, top_k, tail_mass, 0
        self.vocab: int | None = None
        self.kept, self.capped = 0, 0

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        names = (_IDX, _LOGP, _TAIL, _COUNT)
        self._files = [self._stack.enter_context(open(self.dest / n, "wb")) for n in names]  # noqa: SIM115
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False

    def add(self, batch, logits, first: int = 1) -> None:
        import torch.nn.functional as F

        self.vocab = int(logits.shape[-1])
        for r in range(batch.shape[0]):
            self._write(*kept_set(F.log_softmax(logits[r, first - 1 : -1].float(), dim=-1), self.top_k, self.tail_mass))

    def _write(self, idx, top, counts, tail, capped: int) -> None:
        import torch

        for f, arr in zip(self._files, (idx.to(torch.int32), top, tail, counts.to(torch.int32))):
            f.write(arr.contiguous().cpu().numpy().tobytes())
        self.positions += int(counts.shape[0])
        self.kept += int(counts.sum().item())
        self.capped += capped

    def result(self) -> dict:
        return {}


def kept_set(logp, top_k: int, tail_mass: float):
    """(flat ids, their log-probabilities, count per position, tail log-probability per position, positions capped)
    of the kept tokens of each row of `logp` (T, V): the fewest of the most likely (at least MIN_K, at most `top_k`)
    that leave at most `tail_mass` outside. The tail is -inf where every token is kept."""
    import torch

    vocab = logp.shape[-1]
    k_max = min(top_k, vocab)
    top, idx = logp.topk(k_max, dim=-1)  # sorted, most likely first
    inside = top.exp().double().cumsum(-1)
    need = (inside < 1.0 - tail_mass).sum(-1) + 1  # fewest whose mass reaches 1 - tail_mass
    counts = need.clamp(min=min(MIN_K, k_max), max=k_max)
    capped = int((need > k_max).sum().item()) if k_max < vocab else 0
    keep = torch.arange(k_max, device=logp.device)[None, :] < counts[:, None]
    rows = keep.nonzero()[:, 0]
    rest = logp.clone()
    rest[rows, idx[keep]] = float("-inf")
    tail = rest.logsumexp(-1)  # -inf where every token is kept
    return idx[keep], top[keep], counts, tail, capped


class CachedKL:
    """A KL tracker for `_score_batches` reading the base's recorded kept tokens from `src`: the running KL_S(base ‖
    model) (module docstring) at the same positions, in the same order, as they were recorded."""

    def __init__(self, src: Path, meta: dict):
        import numpy as np

        self.vocab, self.positions = meta["vocab"], meta["positions"]
        self.kept, self.capped = meta.get("kept", 0), meta.get("capped", 0)
        n, kept = self.positions, self.kept
        self.idx = np.memmap(src / _IDX, dtype=np.int32, mode="r", shape=(kept,)) if kept else None
        self.logp = np.memmap(src / _LOGP, dtype=np.float32, mode="r", shape=(kept,)) if kept else None
        self.tail = np.memmap(src / _TAIL, dtype=np.float32, mode="r", shape=(n,)) if n else None
        self.counts = np.memmap(src / _COUNT, dtype=np.int32, mode="r", shape=(n,)) if n else None
        self.at, self.entry, self.total = 0, 0, 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add(self, batch, logits, first: int = 1) -> None:
        for r in range(batch.shape[0]):
            self.total += self._row(logits[r, first - 1 : -1])

    def _row(self, logits) -> float:
        import torch
        import torch.nn.functional as F

        n = logits.shape[0]
        if self.at + n > self.positions:
            raise DataError("the cached base evaluation has fewer positions than the text: the cache is stale")
        counts = torch.from_numpy(self.counts[self.at : self.at + n].astype("int64"))
        size = int(counts.sum().item())
        sl = slice(self.entry, self.entry + size)
        lp_tail = torch.from_numpy(self.tail[self.at : self.at + n].copy()).to(logits.device).double()
        self.at, self.entry = self.at + n, self.entry + size
        device = logits.device
        idx = torch.from_numpy(self.idx[sl].astype("int64")).to(device)
        lp = torch.from_numpy(self.logp[sl].copy()).to(device).double()
        pos = torch.repeat_interleave(torch.arange(n), counts).to(device)
        logq = F.log_softmax(logits[:, : self.vocab].float(), dim=-1)
        lq = logq[pos, idx].double()
        kl = torch.zeros(n, dtype=torch.float64, device=device).index_add_(0, pos, lp.exp() * (lp - lq))
        p_tail = lp_tail.exp()
        if bool((p_tail > 0).any()):
            logq[pos, idx] = float("-inf")
            lq_tail = logq.logsumexp(-1).double()
            kl = kl + torch.where(p_tail > 0, p_tail * (lp_tail - lq_tail), torch.zeros_like(p_tail))
        return float(kl.sum().item())

    def result(self) -> dict:
        if self.at != self.positions:
            raise DataError("the cached base evaluation has more positions than the text: the cache is stale")
        if not self.positions:
            return {}
        return {"kl": self.total / self.positions, **({"kl_bound": True} if self.capped else {})}


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
        n, kept = int(meta["positions"]), int(meta["kept"])
        if not isinstance(meta["result"], dict) or meta.get("v") != _VERSION:
            raise ValueError
    except (KeyError, TypeError, ValueError):
        return f"its {_RESULT} is not this version's", {}
    sizes = {_IDX: 4 * kept, _LOGP: 4 * kept, _TAIL: 4 * n, _COUNT: 4 * n}
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
        meta.update(kept=rec.kept, capped=rec.capped, tail_mass=rec.tail_mass, v=_VERSION)
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
