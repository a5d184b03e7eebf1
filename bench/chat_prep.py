"""Chat data at scale: posttrainllm's `sft` preparation of messages rows vs the tokenization TRL's SFTTrainer does
itself on the same rows, side by side: rows per second and peak memory.

    python bench/chat_prep.py [--rows 300000] [--reps 2] [--json] [--model DIR] [--messages-file F] [--parts P]

Data: `--rows` conversations of a system, a user and an assistant turn each (contents are spans of
../shared/data/python_docs.txt of 20-120, 20-300 and 50-900 characters; generated pseudo-words when that file is
absent), or `--messages-file`. Model: bench/smollm2.py's SmolLM2-135M-Instruct unless `--model` (its tokenizer and
chat template; the children that need a trainer build a 1-block model of the same vocabulary, so the memory
figures are the data's, not the model's).

SmolLM2's chat template has no `{% generation %}` markers, so posttrainllm masks the assistant's turns by rendering
the conversation's prefixes (data/chat.py: AssistantSpans) and TRL's `assistant_only_loss` cannot run on it as it
is. TRL's peer therefore gets the same template with the markers added around what the assistant says (checked here
to render the same text and to give the same token ids and mask as posttrainllm on the first rows). Contenders,
each a fresh subprocess with an empty datasets cache, rotated over the repetitions:

* `posttrainllm`: what `sft --max-length 256` runs on the data (`prepare_sft` + `apply_loss_mask`), then TRL's
  SFTTrainer built on the result (TRL adds its labels, truncation and drop steps to every dataset): the data as the
  trainer gets it;
* `trl`: `load_dataset("json")` + SFTTrainer(assistant_only_loss=True, max_length=256): TRL's tokenization;
* `--dataset-num-proc 2` for both (`posttrainllm_np2`, `trl_np2`);
* `cli`: the whole `posttrainllm sft --dry-run --max-length 256` (model load included), as issue #23 measured it.

Time: from the first data access to the trainer's dataset, inside the child (imports, tokenizer and model
excluded). Memory: peak RSS summed over the child and every process it starts (sampled every 50 ms), and the
child's RSS before the data (the imports and the model) for reference.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, base_parser, emit, log, machine_info, median, order_for  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
MAX_LENGTH = 256
ASSISTANT_LINE = "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
MARKED_LINE = (
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ message['content'] + '<|im_end|>' + '\n' }}{% endgeneration %}{% else %}" + ASSISTANT_LINE + "{% endif %}"
)


def write_rows(path: Path, rows: int, seed: int = 0) -> None:
    import random

    src = SHARED / "python_docs.txt"
    if src.exists():
        blob = " ".join(src.read_text(encoding="utf-8").split())
    else:
        from data_scale import _blob

        blob = _blob(seed, 2_000_000)
    r = random.Random(seed)

    def take(n: int) -> str:
        s = blob.find(" ", r.randrange(0, len(blob) - n - 100)) + 1
        e = blob.rfind(" ", s, s + n)
        return blob[s : e if e > s else s + n]

    with open(path, "w", encoding="utf-8") as f:
        for _ in range(rows):
            msgs = [
                {"role": "system", "content": take(r.randint(20, 120))},
                {"role": "user", "content": take(r.randint(20, 300))},
                {"role": "assistant", "content": take(r.randint(50, 900))},
            ]
            f.write(json.dumps({"messages": msgs}) + "\n")


def marked_template(tokenizer) -> str:
    """The tokenizer's template with {% generation %} around the assistant's words (SmolLM2's template only)."""
    from posttrainllm.data.chat import has_generation_markers

    if has_generation_markers(tokenizer):
        return tokenizer.chat_template
    if ASSISTANT_LINE not in tokenizer.chat_template:
        raise SystemExit("this bench adds generation markers to SmolLM2's template only; pass a model that has it")
    return tokenizer.chat_template.replace(ASSISTANT_LINE, MARKED_LINE)


# ----------------------------------------------------------------------------------------------------------------
# Children
# ----------------------------------------------------------------------------------------------------------------


def _tiny_model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    return LlamaForCausalLM(cfg)


def _trainer(model, tokenizer, ds, num_proc, out: str, assistant_only: bool):
    from trl import SFTConfig, SFTTrainer

    conf = SFTConfig(
        output_dir=out, max_length=MAX_LENGTH, report_to=[], use_cpu=True, bf16=False,
        assistant_only_loss=assistant_only, dataset_num_proc=num_proc if num_proc > 1 else None,
    )  # fmt: skip
    return SFTTrainer(model=model, args=conf, train_dataset=ds, processing_class=tokenizer)


def child(mode: str, path: str, model_dir: str, num_proc: int, out: str) -> dict:
    import psutil
    from transformers import AutoTokenizer

    from posttrainllm import data

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = _tiny_model(tokenizer)
    base_rss = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    if mode == "posttrainllm":
        prepared = data.prepare_sft(path, tokenizer, max_length=MAX_LENGTH, num_proc=num_proc)
        loss = data.apply_loss_mask(prepared, tokenizer, num_proc=num_proc)
        t_prep = time.perf_counter() - t0
        trainer = _trainer(model, tokenizer, prepared.train, num_proc, out, loss.assistant_only_loss)
    else:
        import datasets

        tokenizer.chat_template = marked_template(tokenizer)
        ds = datasets.load_dataset("json", data_files=path, split="train")
        t_prep = None
        trainer = _trainer(model, tokenizer, ds, num_proc, out, True)
    seconds = time.perf_counter() - t0
    ds = trainer.train_dataset
    first = ds.select(range(min(200, len(ds))))
    return {
        "seconds": seconds,
        "prep_seconds": t_prep,
        "rows": len(ds),
        "base_rss": base_rss,
        "first": [[r["input_ids"], r["labels"]] for r in first],
    }


# ----------------------------------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------------------------------


def _tree_rss(proc) -> int:
    import psutil

    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(argv: list[str], env: dict, timeout: float = 7200) -> dict:
    """Run a child; its JSON result plus the wall time and the peak RSS summed over its process tree."""
    import psutil

    peak = [0]
    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=fout, stderr=ferr, text=True, env=env)
        ps = psutil.Process(proc.pid)
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], _tree_rss(ps))
                time.sleep(0.05)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            code = proc.wait(timeout=timeout)
        finally:
            done.set()
            t.join()
        wall = time.perf_counter() - t0
        fout.seek(0)
        ferr.seek(0)
        stdout, stderr = fout.read(), ferr.read()
    if code != 0:
        raise RuntimeError(f"failed ({code}): {' '.join(argv)}\n{stdout[-1500:]}\n{stderr[-3000:]}")
    result = {}
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            break
    result.update(peak_rss=peak[0], wall_s=wall)
    return result


def run_one(kind: str, path: Path, model_dir: str, root: Path, env: dict) -> dict:
    cache = root / f"cache-{kind}"
    shutil.rmtree(cache, ignore_errors=True)
    out = root / f"out-{kind}"
    shutil.rmtree(out, ignore_errors=True)
    e = {**env, "HF_DATASETS_CACHE": str(cache)}
    if kind == "cli":
        argv = [sys.executable, "-m", "posttrainllm", "sft", "--model", model_dir, "--dataset", str(path), "--dry-run"]
        argv += ["--max-length", str(MAX_LENGTH), "--output-dir", str(out)]
    else:
        mode, _, np = kind.partition("_np")
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", mode, str(path), model_dir, np or "1"]
        argv.append(str(out))
    r = measure(argv, e)
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return r


def compare_first(a: list, b: list) -> dict:
    """The first rows of two trainers' datasets: same token ids and same trained positions?"""
    same_ids = sum(x[0] == y[0] for x, y in zip(a, b))
    same_labels = sum(x[1] == y[1] for x, y in zip(a, b))
    return {"rows": min(len(a), len(b)), "same_input_ids": same_ids, "same_labels": same_labels}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, path, model_dir, np, out = sys.argv[2:7]
        print(json.dumps(child(mode, path, model_dir, int(np), out)))
        return
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--messages-file", help="measure this messages JSONL instead of generated rows")
    p.add_argument("--model", help="model directory (default: bench/smollm2.py's converted SmolLM2)")
    p.add_argument("--parts", default="posttrainllm,trl,posttrainllm_np2,trl_np2,cli")
    p.add_argument("--np2-reps", type=int, default=1, help="repetitions of the num_proc=2 and cli contenders")
    a = p.parse_args()
    a.reps = a.reps or (1 if a.quick else 2)
    rows = 20_000 if a.quick else a.rows
    model_dir = a.model or subprocess.run(
        [sys.executable, str(Path(__file__).parent / "smollm2.py"), "--dir"], check=True, capture_output=True,
        text=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    env.update(PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="true")
    machine = machine_info(torch_needed=False)
    root = Path(tempfile.mkdtemp(prefix="posttrainllm-chat-"))
    try:
        path = Path(a.messages_file) if a.messages_file else root / "chat.jsonl"
        if not a.messages_file:
            log(f"writing {rows} conversations to {path}")
            write_rows(path, rows)
        result = {"machine": machine, "argv": sys.argv[1:], "model": model_dir, "file_bytes": path.stat().st_size}
        result["raw"] = measure_all(a, path, model_dir, root, env)
        result["ratios"] = summarize(result["raw"])
        for runs in result["raw"].values():
            for run in runs:
                run.pop("first", None)
        emit(result, a.json, report(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure_all(a, path: Path, model_dir: str, root: Path, env: dict) -> dict:
    parts = a.parts.split(",")
    main_kinds = [k for k in ("posttrainllm", "trl") if k in parts]
    raw: dict[str, list[dict]] = {k: [] for k in parts}
    for rep in range(a.reps):
        for kind in order_for(rep, main_kinds):
            log(f"rep {rep + 1}: {kind}")
            raw[kind].append(run_one(kind, path, model_dir, root, env))
    for rep in range(a.np2_reps):
        for kind in order_for(rep, [k for k in parts if k not in main_kinds]):
            log(f"rep {rep + 1}: {kind}")
            raw[kind].append(run_one(kind, path, model_dir, root, env))
    return raw


def summarize(raw: dict) -> dict:
    out: dict = {}
    for kind, runs in raw.items():
        if not runs:
            continue
        rows = runs[0].get("rows") or (raw.get("posttrainllm") or [{}])[0].get("rows")  # cli: the same rows
        out[kind] = {
            "rows": rows,
            "seconds": [round(r.get("seconds", r["wall_s"]), 2) for r in runs],
            "wall_s": [round(r["wall_s"], 2) for r in runs],
            "rows_per_s": median([rows / r.get("seconds", r["wall_s"]) for r in runs]) if rows else None,
            "peak_rss_gb": median([r["peak_rss"] / 2**30 for r in runs]),
            "base_rss_gb": median([r["base_rss"] / 2**30 for r in runs]) if "base_rss" in runs[0] else None,
        }
    if raw.get("posttrainllm") and raw.get("trl"):
        pt, trl = raw["posttrainllm"], raw["trl"]
        out["posttrainllm/trl"] = {
            "rows_per_s": median([(a["rows"] / a["seconds"]) / (b["rows"] / b["seconds"]) for a, b in zip(pt, trl)]),
            "peak_rss": median([a["peak_rss"] / b["peak_rss"] for a, b in zip(pt, trl)]),
            "first_rows": compare_first(pt[0]["first"], trl[0]["first"]),
        }
    for kind in ("posttrainllm", "trl"):
        if raw.get(kind) and raw.get(f"{kind}_np2"):
            one = median([r["seconds"] for r in raw[kind]])
            out[f"{kind} np2/np1"] = {"rows_per_s": one / median([r["seconds"] for r in raw[f"{kind}_np2"]])}
    return out


def report(r: dict) -> str:
    lines = [f"model {r['model']}; data {r['file_bytes'] / 2**20:.0f} MiB; load {r['machine'].get('loadavg_at_start')}"]
    for kind, v in r["ratios"].items():
        if "seconds" in v:
            base = f", before data {v['base_rss_gb']:.2f} GB" if v["base_rss_gb"] is not None else ""
            rate = f"{v['rows_per_s']:.0f} rows/s" if v["rows_per_s"] else "wall only"
            lines.append(
                f"  {kind:17s} {v['rows']} rows  {v['seconds']} s  {rate}  peak RSS {v['peak_rss_gb']:.2f} GB{base}"
            )
        else:
            lines.append(f"  {kind:17s} {json.dumps(v)}")
    m = r["machine"]
    lines.append(f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['date']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
