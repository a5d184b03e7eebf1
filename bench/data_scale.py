"""Data at scale: posttrainllm's preparation vs the plain `datasets` path, side by side, memory and time.

    python bench/data_scale.py [--quick] [--json] [--out DIR] [--sft-file F] [--messages-file F] [--text-file F]

Generates its inputs under --out (default bench/out/data_scale, git-ignored): Alpaca-style JSONL and messages JSONL
at three sizes 10x apart (10k, 100k, 1M rows), raw text at three sizes (10 MB, 100 MB, 1 GB), single records of
50 MB (text, Alpaca, messages), a byte-level BPE tokenizer (8192 tokens) trained on the generated words, and a tiny
llama for the command-line dry runs. `--quick` divides every size by 5 (records: 10 MB).

Every measurement is a fresh subprocess (its own imports, its own empty datasets cache); peak RSS is the child's
`ru_maxrss` (os.wait4), preparation time is measured inside the child from the first data access to the prepared
dataset (imports and the tokenizer load excluded). Contenders, run in rotated order:

* SFT (Alpaca, 3 repetitions in rotated order, medians of the ratios):
  `posttrainllm.data.prepare_sft(file, tokenizer, max_length=512)` (what `sft` runs) vs
  `load_dataset("json")` + a batched `map` to prompt/completion with the same template (the native path).
* SFT (messages, 3 repetitions): `prepare_sft` vs `load_dataset("json")` alone (TRL takes messages as they are).
* finetune (text): `prepare_text(file, tokenizer, max_length=512)` vs transformers' run_clm recipe
  (`load_dataset("text", keep_linebreaks=True)`, `map(tokenizer, batched=True)`, `map(group_texts, batched=True)`);
  tokenization throughput = tokens / seconds of the tokenizing map in each; `--streaming`: the same file read as a
  stream, every block consumed.
* the command line: `posttrainllm sft|finetune --dry-run` on the largest inputs (whole-process peak RSS).
* the second run of `prepare_sft` / `prepare_text` on the same datasets cache (the speed-up of the cache).
* single records: the peak memory a 50 MB record adds (after a warm-up on a small file), divided by its size.

`--sft-file/--messages-file/--text-file` measure given files instead of the generated largest ones (for an
independent check on inputs the author has not seen). Targets (issue #11): SFT 1M rows peak RSS <= 1.5x native and
<= 2 GB, time <= 1.2x native (Alpaca and messages); finetune 1 GB text peak RSS <= 3 GB (<= 1.5 GB streaming),
tokenization >= 0.8x native; time linear and peak RSS about flat over the three sizes; a 50 MB record read within a
few times its size.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ALPACA_PROMPT, ALPACA_PROMPT_NO_INPUT, REPO, base_parser, emit, log, machine_info  # noqa: E402

MAX_LENGTH = 512


# ----------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------


def _blob(seed: int = 0, n_words: int = 8_000_000) -> str:
    """A long string of pseudo-words with Zipf-like frequencies and some punctuation (the source of all text)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    syllables = [
        "ka",
        "lo",
        "mi",
        "ne",
        "ru",
        "sa",
        "to",
        "vi",
        "da",
        "pe",
        "qu",
        "ri",
        "zo",
        "ba",
        "te",
        "shi",
        "an",
        "el",
        "or",
        "um",
        "st",
        "gr",
        "th",
        "ch",
    ]
    vocab = []
    for _ in range(6000):
        k = rng.integers(1, 5)
        vocab.append("".join(rng.choice(syllables, size=k)))
    vocab += ["the", "of", "and", "to", "in", "is", "that", "for", "it", "with", "as", "on", "be", "at", "by"]
    vocab = np.array(vocab)
    p = 1.0 / (np.arange(len(vocab)) + 2.7)
    p /= p.sum()
    words = vocab[rng.choice(len(vocab), size=n_words, p=p)]
    punct = rng.random(n_words)
    words = np.where(punct < 0.04, np.char.add(words, "."), np.where(punct < 0.07, np.char.add(words, ","), words))
    return " ".join(words.tolist())


class Words:
    """Random spans of the blob, cut at spaces: fast fields of a given length."""

    def __init__(self, blob: str, seed: int):
        import random

        self.blob, self.rng = blob, random.Random(seed)

    def take(self, n_chars: int) -> str:
        if n_chars <= 0:
            return ""
        start = self.blob.find(" ", self.rng.randrange(0, len(self.blob) - n_chars - 100)) + 1
        end = self.blob.rfind(" ", start, start + n_chars)
        return self.blob[start : end if end > start else start + n_chars]


def write_alpaca(path: Path, rows: int, blob: str, seed: int) -> None:
    w = Words(blob, seed)
    r = w.rng
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(rows):
            rec = {
                "instruction": w.take(r.randint(20, 180)),
                "input": w.take(r.randint(20, 300)) if r.random() < 0.4 else "",
                "output": w.take(r.randint(100, 1200)),
            }
            f.write(json.dumps(rec))
            f.write("\n")


def write_messages(path: Path, rows: int, blob: str, seed: int) -> None:
    w = Words(blob, seed)
    r = w.rng
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(rows):
            msgs = [{"role": "system", "content": w.take(r.randint(20, 120))}] if r.random() < 0.3 else []
            for _ in range(r.randint(1, 3)):
                msgs.append({"role": "user", "content": w.take(r.randint(20, 300))})
                msgs.append({"role": "assistant", "content": w.take(r.randint(50, 600))})
            f.write(json.dumps({"messages": msgs}))
            f.write("\n")


def write_text(path: Path, n_bytes: int, blob: str, seed: int) -> None:
    w = Words(blob, seed)
    r = w.rng
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < n_bytes:
            lines = []
            for _ in range(r.randint(1, 8)):
                lines.append(("    " if r.random() < 0.1 else "") + w.take(r.randint(20, 160)))
            para = "\n".join(lines) + "\n\n"
            f.write(para)
            written += len(para)


def write_records(out: Path, size: int, blob: str) -> dict[str, Path]:
    """One record of `size` bytes per shape, plus a small file of the same shape for the warm-up."""
    w = Words(blob, 7)
    big_text = "\n".join(w.take(2000) for _ in range(size // 2000 + 1))[:size]
    files = {}
    recs = {
        "text": ({"text": big_text}, {"text": big_text[:20000]}),
        "alpaca": (
            {"instruction": "Summarize.", "input": big_text[: size // 2], "output": big_text[size // 2 :]},
            {"instruction": "Summarize.", "input": "a b", "output": big_text[:2000]},
        ),
        "messages": (
            {
                "messages": [
                    {"role": "user" if i % 2 == 0 else "assistant", "content": big_text[i * 100 : (i + 1) * 100]}
                    for i in range(size // 100)
                ]
            },
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": big_text[:2000]}]},
        ),
    }
    for kind, (big, small) in recs.items():
        files[kind] = out / f"record_{kind}.jsonl"
        files[kind].write_text(json.dumps(big) + "\n")
        (out / f"record_{kind}_small.jsonl").write_text(json.dumps(small) + "\n")
    return files


def build_inputs(out: Path, quick: bool, div: int = 1) -> dict:
    """Generate (or reuse) every input; returns their paths and sizes."""
    div = div * (5 if quick else 1)
    rows = [10_000 // div, 100_000 // div, 1_000_000 // div]
    text_sizes = [10_000_000 // div, 100_000_000 // div, 1_000_000_000 // div]
    record = ((10 if quick else 50) << 20) // (div if div > 5 else 1)
    out.mkdir(parents=True, exist_ok=True)
    stamp = out / f"inputs-{'quick' if quick else 'full'}-{div}.json"
    if stamp.exists():
        return json.loads(stamp.read_text())
    t0 = time.time()
    blob = _blob()
    log(f"word blob: {len(blob) / 1e6:.0f} MB in {time.time() - t0:.0f} s")
    inputs: dict = {"alpaca": {}, "messages": {}, "text": {}}
    for i, n in enumerate(rows):
        p = out / f"alpaca_{n}.jsonl"
        write_alpaca(p, n, blob, seed=i)
        inputs["alpaca"][str(n)] = str(p)
        p = out / f"messages_{n}.jsonl"
        write_messages(p, n, blob, seed=10 + i)
        inputs["messages"][str(n)] = str(p)
        log(f"  {n} rows written ({time.time() - t0:.0f} s)")
    for i, n in enumerate(text_sizes):
        p = out / f"text_{n // 1_000_000}MB.txt"
        write_text(p, n, blob, seed=20 + i)
        inputs["text"][str(n)] = str(p)
        log(f"  text {n / 1e6:.0f} MB written ({time.time() - t0:.0f} s)")
    inputs["records"] = {k: str(v) for k, v in write_records(out, record, blob).items()}
    inputs["record_bytes"] = record
    # tokenizer (trained on the words) and a tiny llama for the command-line runs
    sys.path.insert(0, str(REPO))
    from posttrainllm.models import train_bpe_tokenizer

    tok = train_bpe_tokenizer((blob[i : i + 100_000] for i in range(0, 20_000_000, 100_000)), 8192)
    tok.save_pretrained(out / "tokenizer")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    inputs["tokenizer"] = str(out / "tokenizer")
    inputs["model"] = str(out / "model")
    log(f"inputs ready in {time.time() - t0:.0f} s")
    stamp.write_text(json.dumps(inputs, indent=1))
    return inputs


# ----------------------------------------------------------------------------------------------------------------
# Children: one measurement each, a JSON line on stdout
# ----------------------------------------------------------------------------------------------------------------


def _child(mode: str, path: str, tokenizer_dir: str) -> dict:
    import resource

    sys.path.insert(0, str(REPO))
    import datasets
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if mode.startswith("pt_"):
        from posttrainllm import data as D
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out: dict = {}
    t0 = time.perf_counter()
    if mode in ("pt_sft", "pt_sft_no_length_check"):
        prep = D.prepare_sft(path, tok, max_length=MAX_LENGTH if mode == "pt_sft" else None)
        out["rows"] = prep.n_train
    elif mode == "native_sft":
        ds = datasets.load_dataset("json", data_files=path, split="train")

        def to_pc(b):
            prompts = [
                (ALPACA_PROMPT if i.strip() else ALPACA_PROMPT_NO_INPUT).format(instruction=s, input=i)
                for s, i in zip(b["instruction"], b["input"])
            ]
            return {"prompt": prompts, "completion": b["output"]}

        ds = ds.map(to_pc, batched=True, remove_columns=ds.column_names)
        out["rows"] = ds.num_rows
    elif mode == "native_messages":
        ds = datasets.load_dataset("json", data_files=path, split="train").select_columns(["messages"])
        out["rows"] = ds.num_rows
    elif mode == "pt_text":
        from posttrainllm.data import text as T

        ds = T.load_texts(path)
        t1 = time.perf_counter()
        tokenized = T.tokenize(ds, tok, path)
        t2 = time.perf_counter()
        n_tokens = T.count_tokens(tokenized)
        blocks = T.group(tokenized, MAX_LENGTH, n_tokens)
        out.update(rows=blocks.num_rows, tokens=n_tokens, tokenize_s=t2 - t1)
    elif mode == "pt_text_prepare":  # the public entry point (for the cache speed-up)
        out["rows"] = D.prepare_text(path, tok, max_length=MAX_LENGTH).n_train
    elif mode == "pt_text_stream":
        prep = D.prepare_text(path, tok, max_length=MAX_LENGTH, streaming=True)
        n = 0
        for _ in prep.train:
            n += 1
        out["rows"] = n
    elif mode == "native_text":
        from itertools import chain

        ds = datasets.load_dataset("text", data_files=path, split="train", keep_linebreaks=True)
        t1 = time.perf_counter()
        tokenized = ds.map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
        t2 = time.perf_counter()

        def group_texts(examples):
            concatenated = {k: list(chain(*examples[k])) for k in examples}
            total = (len(concatenated["input_ids"]) // MAX_LENGTH) * MAX_LENGTH
            result = {k: [t[i : i + MAX_LENGTH] for i in range(0, total, MAX_LENGTH)] for k, t in concatenated.items()}
            result["labels"] = result["input_ids"].copy()
            return result

        blocks = tokenized.map(group_texts, batched=True)
        import pyarrow.compute as pc

        n_tokens = sum(pc.sum(pc.list_value_length(c)).as_py() or 0 for c in tokenized.data.column("input_ids").chunks)
        out.update(rows=blocks.num_rows, tokens=n_tokens, tokenize_s=t2 - t1)
    else:
        raise SystemExit(f"unknown mode {mode}")
    out["prep_s"] = time.perf_counter() - t0
    out["rss0"] = rss0
    out["vm_hwm"] = _vm_hwm()
    return out


def _vm_hwm() -> int:
    """This process's own peak RSS (VmHWM belongs to the address space, so it starts afresh at exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _record_child(kind: str, path: str, small: str, tokenizer_dir: str) -> dict:
    """The memory a single big record adds: warm up on a small record of the same shape first."""
    import resource

    sys.path.insert(0, str(REPO))
    import datasets
    from transformers import AutoTokenizer

    from posttrainllm import data as D

    datasets.disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)

    def run(p):
        if kind == "text":
            return D.prepare_text(p, tok, max_length=MAX_LENGTH)
        return D.prepare_sft(p, tok, max_length=MAX_LENGTH)

    run(small)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    run(path)
    extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {
        "extra_bytes": extra,
        "size": os.path.getsize(path),
        "ratio": extra / os.path.getsize(path),
        "prep_s": time.perf_counter() - t0,
    }


def measure(argv: list[str], cache: Path | None, env: dict | None = None, timeout: float = 7200) -> dict:
    """Run a child; returns its JSON result plus peak RSS (ru_maxrss of that child) and wall time."""
    full_env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "true",
        **(env or {}),
    }
    if cache is not None:
        full_env["HF_DATASETS_CACHE"] = str(cache)
    import tempfile

    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:  # files: no pipe to fill up
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=fout, stderr=ferr, text=True, env=full_env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        fout.seek(0)
        ferr.seek(0)
        stdout, stderr = fout.read(), ferr.read()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"failed ({code}): {' '.join(argv)}\n{stdout[-1500:]}\n{stderr[-3000:]}")
    result = {}
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            break
    result.update(peak_rss=usage.ru_maxrss * 1024, wall_s=wall)
    return result


def child_cmd(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", *args]


# ----------------------------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------------------------


def gb(n: float) -> str:
    return f"{n / 2**30:.2f} GB"


def fresh(out: Path, name: str) -> Path:
    d = out / "caches" / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def _warm(path: str) -> None:
    """Read the input once so that it is in the page cache for every contender."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def pair(
    out: Path,
    tag: str,
    path: str,
    tok: str,
    pt_mode: str,
    native_mode: str,
    reps: int,
    extra: dict[str, str] | None = None,
) -> dict:
    """posttrainllm vs native on one file, each with an empty cache, `reps` times in rotated order (medians of the
    per-repetition ratios); then a second posttrainllm run on its warm cache. `extra`: more contenders (name: mode),
    compared with native the same way."""
    import statistics

    _warm(path)
    order = [("native", native_mode), ("posttrainllm", pt_mode), *(extra or {}).items()]
    runs: dict[str, list] = {name: [] for name, _ in order}
    for rep in range(reps):
        k = rep % len(order)
        for name, mode in order[k:] + order[:k]:
            cache = fresh(out, f"{tag}-{name}")
            log(f"  {tag}: {name} (repetition {rep + 1}/{reps}) ...")
            runs[name].append(measure(child_cmd(mode, path, tok), cache))
            if name == "posttrainllm" and rep == reps - 1:
                runs["second"] = [measure(child_cmd(mode, path, tok), cache)]
            shutil.rmtree(cache, ignore_errors=True)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    res: dict = {"reps": reps, "runs": runs}
    for name in ("native", "posttrainllm"):
        rs = runs[name]
        res[name] = {
            **rs[0],
            "prep_s": med([r["prep_s"] for r in rs]),
            "peak_rss": med([r["peak_rss"] for r in rs]),
            "prep_s_all": [round(r["prep_s"], 2) for r in rs],
            "peak_rss_all": [r["peak_rss"] for r in rs],
        }
    res["posttrainllm_second_run"] = runs["second"][0]
    res["rss_ratio"] = med([a["peak_rss"] / b["peak_rss"] for a, b in zip(runs["posttrainllm"], runs["native"])])
    res["time_ratio"] = med([a["prep_s"] / b["prep_s"] for a, b in zip(runs["posttrainllm"], runs["native"])])
    res["time_ratio_all"] = [round(a["prep_s"] / b["prep_s"], 3) for a, b in zip(runs["posttrainllm"], runs["native"])]
    res["cache_speedup"] = res["posttrainllm"]["prep_s"] / res["posttrainllm_second_run"]["prep_s"]
    for name in extra or {}:
        rs = runs[name]
        res[name] = {
            "prep_s": med([r["prep_s"] for r in rs]),
            "peak_rss": med([r["peak_rss"] for r in rs]),
            "time_ratio": med([a["prep_s"] / b["prep_s"] for a, b in zip(rs, runs["native"])]),
            "time_ratio_all": [round(a["prep_s"] / b["prep_s"], 3) for a, b in zip(rs, runs["native"])],
        }
    if "tokens" in res["native"]:
        rate = {k: res[k]["tokens"] / res[k]["tokenize_s"] for k in ("native", "posttrainllm")}
        res["tokens_per_s"] = rate
        res["tokenize_throughput_ratio"] = rate["posttrainllm"] / rate["native"]
    return res


def cli_dry_run(out: Path, command: str, path: str, model: str, extra: list[str] = ()) -> dict:
    cache = fresh(out, f"cli-{command}")
    exe = Path(sys.executable).parent / "posttrainllm"
    argv = [
        str(exe),
        command,
        "--model",
        model,
        "--dataset",
        path,
        "--output-dir",
        str(out / f"cli-{command}-out"),
        "--dry-run",
        "--overwrite",
        "--max-length",
        str(MAX_LENGTH),
        *extra,
    ]
    log(f"  CLI {command} --dry-run ...")
    res = measure(argv, cache, env={"PYTHONPATH": str(REPO)})
    shutil.rmtree(cache, ignore_errors=True)
    return {"peak_rss": res["peak_rss"], "wall_s": res["wall_s"]}


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "bench" / "out" / "data_scale"), help="inputs and caches (git-ignored)")
    p.add_argument("--sft-file", help="measure this Alpaca-style JSONL instead of the generated 1M-row one")
    p.add_argument("--messages-file", help="measure this messages JSONL instead of the generated one")
    p.add_argument("--text-file", help="measure this text file instead of the generated 1 GB one")
    p.add_argument("--skip-curve", action="store_true", help="only the largest inputs")
    p.add_argument("--divide", type=int, default=1, help="divide every size by N (a smoke run of the benchmark)")
    p.add_argument(
        "--only",
        default="sft,messages,text,cli,curve,records",
        help="comma-separated parts to run (default: all): sft, messages, text, cli, curve, records",
    )
    p.add_argument("--child", nargs="+", help=argparse_hidden())
    a = p.parse_args()
    if a.child:
        if a.child[0] == "build":
            print(json.dumps(build_inputs(Path(a.child[1]), a.child[2] == "quick", int(a.child[3]))))
        elif a.child[0] == "record":
            print(json.dumps(_record_child(*a.child[1:])))
        else:
            print(json.dumps(_child(*a.child)))
        return

    out = Path(a.out)
    t_start = time.time()
    info = machine_info(torch_needed=False)
    # Inputs are generated in a child: a child's ru_maxrss starts from its parent's RSS at fork time, so the parent
    # must stay small for the children's peaks to be theirs.
    flags = ["quick" if a.quick else "full", str(a.divide)]
    inputs = measure(child_cmd("build", str(out), *flags), None)
    inputs = {k: v for k, v in inputs.items() if k not in ("peak_rss", "wall_s")}
    tok = inputs["tokenizer"]
    sizes = sorted(inputs["alpaca"], key=int)
    text_sizes = sorted(inputs["text"], key=int)
    big = {
        "alpaca": a.sft_file or inputs["alpaca"][sizes[-1]],
        "messages": a.messages_file or inputs["messages"][sizes[-1]],
        "text": a.text_file or inputs["text"][text_sizes[-1]],
    }
    result: dict = {
        "machine": info,
        "argv": sys.argv[1:],
        "inputs": {k: {"path": v, "bytes": os.path.getsize(v)} for k, v in big.items()},
    }

    log(f"largest inputs: {', '.join(f'{k} {os.path.getsize(v) / 1e6:.0f} MB' for k, v in big.items())}")
    parts = set(a.only.split(","))
    if "sft" in parts:
        result["sft"] = pair(out, "sft", big["alpaca"], tok, "pt_sft", "native_sft", reps=a.reps or 3)
    if "messages" in parts:
        result["messages"] = pair(
            out,
            "messages",
            big["messages"],
            tok,
            "pt_sft",
            "native_messages",
            reps=a.reps or 3,
            extra={"posttrainllm_no_length_check": "pt_sft_no_length_check"},
        )
    if "text" in parts:
        result["text"] = pair(out, "text", big["text"], tok, "pt_text", "native_text", reps=1)
        cache = fresh(out, "text-stream")
        log("  text: posttrainllm --streaming ...")
        result["text"]["posttrainllm_streaming"] = measure(child_cmd("pt_text_stream", big["text"], tok), cache)
        shutil.rmtree(cache, ignore_errors=True)
    if "cli" in parts:
        result["cli"] = {
            "sft": cli_dry_run(out, "sft", big["alpaca"], inputs["model"]),
            "sft_messages": cli_dry_run(out, "sft", big["messages"], inputs["model"]),
            # the whole-process figure on the 100 MB text (a third 1 GB tokenization would add ~10 min here)
            "finetune": cli_dry_run(out, "finetune", a.text_file or inputs["text"][text_sizes[1]], inputs["model"]),
        }
    if "curve" in parts and not a.skip_curve:
        curve: dict = {"alpaca": {}, "text": {}}
        for n in sizes[:-1] if not a.sft_file else sizes:
            cache = fresh(out, f"curve-{n}")
            log(f"  curve: alpaca {n} rows ...")
            curve["alpaca"][n] = measure(child_cmd("pt_sft", inputs["alpaca"][n], tok), cache)
            shutil.rmtree(cache, ignore_errors=True)
        if not a.sft_file and "sft" in result:
            curve["alpaca"][sizes[-1]] = result["sft"]["posttrainllm"]
        for n in text_sizes[:-1] if not a.text_file else text_sizes:
            cache = fresh(out, f"curve-text-{n}")
            log(f"  curve: text {int(n) / 1e6:.0f} MB ...")
            curve["text"][n] = measure(child_cmd("pt_text_prepare", inputs["text"][n], tok), cache)
            shutil.rmtree(cache, ignore_errors=True)
        if not a.text_file and "text" in result:
            curve["text"][text_sizes[-1]] = result["text"]["posttrainllm"]
        result["curve"] = curve
    records = {}
    for kind, path in inputs["records"].items() if "records" in parts else ():
        cache = fresh(out, f"record-{kind}")
        log(f"  record: {kind} ...")
        small = path.replace(".jsonl", "_small.jsonl")
        records[kind] = measure(child_cmd("record", kind, path, small, tok), cache)
        shutil.rmtree(cache, ignore_errors=True)
    result["records"] = records
    result["seconds"] = round(time.time() - t_start)
    emit(result, a.json, summary(result))
    name = f"results-{'quick' if a.quick else 'full'}{'' if len(parts) == 6 else '-' + '-'.join(sorted(parts))}.json"
    (out / name).write_text(json.dumps(result, indent=1, default=str))


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


def summary(r: dict) -> str:
    lines = [f"machine: {r['machine']}", ""]
    for key, title in (("sft", "SFT, Alpaca JSONL"), ("messages", "SFT, messages JSONL"), ("text", "finetune, text")):
        if key not in r:
            continue
        x = r[key]
        size = r["inputs"]["alpaca" if key == "sft" else key]["bytes"]
        lines.append(f"{title} ({size / 1e6:.0f} MB, {x['posttrainllm']['rows']} rows/blocks):")
        lines.append(
            f"  peak RSS   posttrainllm {gb(x['posttrainllm']['peak_rss'])} | native {gb(x['native']['peak_rss'])}"
            f" | ratio {x['rss_ratio']:.2f}"
        )
        lines.append(
            f"  prep time  posttrainllm {x['posttrainllm']['prep_s']:.1f} s | native {x['native']['prep_s']:.1f} s"
            f" | ratio {x['time_ratio']:.2f} (median of {x['reps']}: {x['time_ratio_all']})"
        )
        if "posttrainllm_no_length_check" in x:
            y = x["posttrainllm_no_length_check"]
            lines.append(
                f"  without the --max-length check: {y['prep_s']:.1f} s, ratio {y['time_ratio']:.2f} "
                f"({y['time_ratio_all']})"
            )
        lines.append(
            f"  second run (cache) {x['posttrainllm_second_run']['prep_s']:.1f} s: {x['cache_speedup']:.1f}x faster"
        )
        if "tokens_per_s" in x:
            t = x["tokens_per_s"]
            lines.append(
                f"  tokenization  posttrainllm {t['posttrainllm'] / 1e6:.2f} M tok/s | native {t['native'] / 1e6:.2f}"
                f" M tok/s | ratio {x['tokenize_throughput_ratio']:.2f}"
            )
            s = x["posttrainllm_streaming"]
            lines.append(
                f"  --streaming (all {s['rows']} blocks read): peak RSS {gb(s['peak_rss'])}, {s['prep_s']:.1f} s"
            )
    if "cli" in r:
        lines.append(
            "command line --dry-run, whole process: "
            + ", ".join(f"{k} {gb(v['peak_rss'])} ({v['wall_s']:.0f} s)" for k, v in r["cli"].items())
        )
    if "curve" in r:
        for kind, pts in r["curve"].items():
            lines.append(
                f"cost curve ({kind}): "
                + ", ".join(f"{k}: {v['prep_s']:.1f} s {gb(v['peak_rss'])}" for k, v in pts.items())
            )
    if r["records"]:
        lines.append(
            "single records: "
            + ", ".join(
                f"{k} {v['size'] / 2**20:.0f} MiB -> +{v['extra_bytes'] / 2**20:.0f} MiB ({v['ratio']:.1f}x)"
                for k, v in r["records"].items()
            )
        )
    lines.append(f"total {r['seconds']} s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
