"""Training throughput: `posttrainllm sft --llrd 0.9` vs `posttrainllm sft` (flat) vs a plain TRL SFTTrainer script.

    python bench/throughput.py [--quick] [--json] [--steps N] [--reps N] [--threads 1]

Setup (in a temp dir, nothing downloaded): a few hundred generated Alpaca-style rows (JSONL), a byte-level BPE
tokenizer trained on them (`posttrainllm.models.train_bpe_tokenizer`), and a llama-shaped model (hidden 256,
6 blocks, random init) saved with `save_pretrained`. Each contender is a subprocess (so it pays its own imports)
with the same model, data, batch, max length, steps, seed, LR, optimizer (adamw_torch), fp32,
no gradient checkpointing, report_to=[], no checkpoint during training (posttrainllm: --save-steps > steps; TRL
script: save_strategy="no"), and both save the final model at the end. The order rotates between repetitions.

Figures: the trainer's own `train_samples_per_second` (train_runtime based, i.e. without imports, data
preparation and saving), tokens/s = TRL's logged `num_tokens` / train_runtime, and, separately, the process wall
time. Ratios are per repetition (the contenders of one repetition ran next to each other), median over
repetitions. Targets: llrd/flat ≥ 0.97, flat/TRL ≥ 0.95 (samples/s).

Threads: OMP_NUM_THREADS=1 by default (``--threads``): on a shared 2-core machine, 2-thread OpenMP regions wait for
descheduled threads and single steps take 10-100× longer, which buries any difference in noise.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ALPACA_PROMPT, ALPACA_PROMPT_NO_INPUT  # noqa: E402 - posttrainllm.data's text, checked in setup()

LR = 2e-5  # posttrainllm sft's default LR, given to the TRL script too
RESULT_TAG = "TRL_RESULT "


# ------------------------------------------------------------------------------------------------- TRL worker
def trl_worker(
    model_dir: str, dataset: str, out: str, steps: int, batch: int, max_length: int, precision: str = "fp32"
) -> None:
    """The plain TRL script (what a user would write by hand). Prints one JSON line with its metrics."""
    t_start = time.perf_counter()
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    t_imports = time.perf_counter()

    def to_pc(row):
        tpl = ALPACA_PROMPT if row["input"].strip() else ALPACA_PROMPT_NO_INPUT
        return {"prompt": tpl.format(instruction=row["instruction"], input=row["input"]), "completion": row["output"]}

    ds = load_dataset("json", data_files=dataset, split="train")
    ds = ds.map(to_pc, remove_columns=ds.column_names)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16 if precision == "bf16" else torch.float32
    )
    args = SFTConfig(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=batch,
        max_length=max_length,
        learning_rate=LR,
        optim="adamw_torch",
        seed=42,
        bf16=precision == "bf16",
        gradient_checkpointing=False,
        report_to=[],
        save_strategy="no",
        logging_steps=10,
        packing=False,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    t_setup = time.perf_counter()
    metrics = trainer.train().metrics
    t_train = time.perf_counter()
    trainer.save_model(out)
    t_end = time.perf_counter()
    num_tokens = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    print(
        RESULT_TAG
        + json.dumps(
            {
                "metrics": metrics,
                "num_tokens": num_tokens[-1] if num_tokens else None,
                "peak_memory_gb": peak,
                "imports_s": t_imports - t_start,
                "setup_s": t_setup - t_imports,
                "train_call_s": t_train - t_setup,
                "save_s": t_end - t_train,
            }
        ),
        flush=True,
    )


# ------------------------------------------------------------------------------------------------- setup
WORDS = [
    "data",
    "model",
    "train",
    "learn",
    "layer",
    "token",
    "weight",
    "value",
    "loss",
    "rate",
    "step",
    "batch",
    "graph",
    "query",
    "answer",
    "list",
    "sort",
    "number",
    "string",
    "file",
    "read",
    "write",
    "parse",
    "split",
    "merge",
    "count",
    "table",
    "column",
    "row",
    "index",
    "key",
    "map",
    "filter",
    "reduce",
    "cache",
    "memory",
    "thread",
    "process",
    "network",
    "server",
    "client",
    "request",
    "response",
    "error",
    "test",
    "check",
    "build",
    "run",
]


def gen_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)

    def sent(k):
        return " ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + "."

    rows = []
    for i in range(n):
        instruction = f"Task {i}: " + sent(rng.randint(6, 16))
        inp = " ".join(sent(rng.randint(5, 12)) for _ in range(rng.randint(0, 3)))
        output = " ".join(sent(rng.randint(6, 14)) for _ in range(rng.randint(2, 8)))
        rows.append({"instruction": instruction, "input": inp, "output": output})
    return rows


def gemma3_config(hidden: int, blocks: int, vocab: int, model_vocab: int):
    """A Gemma-3-shaped config: Gemma-3-270M's proportions (head dim 256, one KV head, every sixth block full
    attention, the rest a 512-token sliding window, tied embeddings) at `hidden` × `blocks`, and an embedding of
    `model_vocab` rows (262,144 for Gemma's: the LM head is the step's largest tensor) over a tokenizer of `vocab`."""
    from transformers import Gemma3TextConfig

    heads = max(1, hidden // 160)
    return Gemma3TextConfig(
        hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=blocks, num_attention_heads=heads,
        num_key_value_heads=1, head_dim=256, vocab_size=max(model_vocab, vocab), max_position_embeddings=2048,
        sliding_window=512, tie_word_embeddings=True,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(blocks)],
    )  # fmt: skip


def setup(root: Path, n_rows: int, hidden: int, blocks: int, vocab: int, arch: str = "llama",
          model_vocab: int = 0) -> dict:  # fmt: skip
    import torch
    from common import llama_config
    from transformers import AutoModelForCausalLM

    from posttrainllm import data as ptdata
    from posttrainllm.models import train_bpe_tokenizer

    assert (ptdata.ALPACA_PROMPT, ptdata.ALPACA_PROMPT_NO_INPUT) == (ALPACA_PROMPT, ALPACA_PROMPT_NO_INPUT), (
        "posttrainllm's Alpaca template changed: update bench/throughput.py"
    )
    rows = gen_rows(n_rows)
    dataset = root / "alpaca.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    texts = [" ".join(r.values()) for r in rows] + [ALPACA_PROMPT, ALPACA_PROMPT_NO_INPUT]
    tok = train_bpe_tokenizer(texts, vocab)
    if arch == "gemma3":
        cfg = gemma3_config(hidden, blocks, len(tok), model_vocab)
    else:
        cfg = llama_config(hidden, blocks, vocab=max(len(tok), model_vocab), max_pos=1024)  # head dim 64, GQA 2:1
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    lens = sorted(len(tok(ALPACA_PROMPT.format(**r) + r["output"]).input_ids) for r in rows[:200])
    return {
        "dataset": str(dataset),
        "model_dir": str(model_dir),
        "rows": n_rows,
        "vocab": len(tok),
        "model_vocab": cfg.vocab_size,
        "arch": arch,
        "params": sum(p.numel() for p in model.parameters()),
        "hidden": hidden,
        "blocks": blocks,
        "tokens_per_row_median": lens[len(lens) // 2],
        "tokens_per_row_max": lens[-1],
    }


# ------------------------------------------------------------------------------------------------- contenders
def contender(
    kind: str,
    info: dict,
    root: Path,
    steps: int,
    batch: int,
    max_length: int,
    env: dict,
    counter: list,
    precision: str = "fp32",
):
    from common import VENV_BIN, run_cmd

    def run() -> dict:
        counter[0] += 1
        out = root / f"run{counter[0]}_{kind}"
        if kind == "trl":
            argv = [
                sys.executable,
                __file__,
                "--trl-worker",
                info["model_dir"],
                info["dataset"],
                str(out),
                str(steps),
                str(batch),
                str(max_length),
                precision,
            ]
        else:
            exe = VENV_BIN / "posttrainllm"
            argv = [
                str(exe) if exe.exists() else "posttrainllm",
                "sft",
                "--model",
                info["model_dir"],
                "--dataset",
                info["dataset"],
                "--output-dir",
                str(out),
                "--max-steps",
                str(steps),
                "--batch-size",
                str(batch),
                "--max-length",
                str(max_length),
                "--precision",
                precision,
                "--save-steps",
                str(steps + 1000),
                "--logging-steps",
                "10",
                "--lr",
                str(LR),
                "--seed",
                "42",
            ]
            if kind == "llrd":
                argv += ["--llrd", "0.9"]
            if kind == "packed":
                argv += ["--packing"]
            if kind == "padded":  # sft's default is padding-free where exact: this is the padded batch
                argv += ["--no-padding-free"]
        wall, proc = run_cmd(argv, env=env)
        if kind == "trl":
            line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG))
            r = json.loads(line[len(RESULT_TAG) :])
            metrics, num_tokens = r["metrics"], r["num_tokens"]
            extra = {k: r[k] for k in ("imports_s", "setup_s", "train_call_s", "save_s", "peak_memory_gb")}
        else:
            metrics = json.loads((out / "eval_results.json").read_text())["train"]
            state = json.loads((out / "trainer_state.json").read_text())
            toks = [h["num_tokens"] for h in state["log_history"] if "num_tokens" in h]
            num_tokens = toks[-1] if toks else None
            extra = {}
            groups = json.loads((out / "param_groups.json").read_text())
            extra["n_groups"] = len(groups)
            peak = json.loads((out / "eval_results.json").read_text()).get("peak_memory_bytes")
            extra["peak_memory_gb"] = peak / 2**30 if peak else None
        shutil.rmtree(out, ignore_errors=True)
        rt = metrics["train_runtime"]
        return {
            "wall_s": wall,
            "train_runtime_s": rt,
            "samples_per_s": metrics["train_samples_per_second"],
            "tokens_per_s": num_tokens / rt if num_tokens else None,
            "num_tokens": num_tokens,
            "train_loss": metrics.get("train_loss"),
            **extra,
        }

    return run


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--trl-worker":
        m, d, o, s, b, L, prec = sys.argv[2:9]
        trl_worker(m, d, o, int(s), int(b), int(L), prec)
        return

    from common import base_parser, emit, fmt_count, log, machine_info, median, order_for, spread

    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 10 quick / 30)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--rows", type=int, default=400)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="bf16 needs a GPU")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for every contender (0: unset)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--kinds", default="llrd,flat,trl",
                   help="contenders: llrd, flat, packed (--packing), padded (--no-padding-free), trl")  # fmt: skip
    p.add_argument("--arch", default="llama", choices=("llama", "gemma3"), help="the model's shape")
    p.add_argument("--model-vocab", type=int, default=0,
                   help="embedding rows when larger than the tokenizer's (262144: Gemma 3's LM head)")  # fmt: skip
    p.add_argument("--out-json", type=Path, default=None, help="also write the JSON result to this file")
    a = p.parse_args()
    reps = a.reps or (2 if a.quick else 4)
    steps = a.steps or (10 if a.quick else 30)
    env = {
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "PYTHONWARNINGS": "ignore",
    }
    if a.threads > 0:
        env.update(OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    machine = machine_info()  # before the runs: the load average is the one at start
    root = Path(tempfile.mkdtemp(prefix="posttrainllm-bench-"))
    try:
        log(f"setup in {root} ...")
        info = setup(root, a.rows, a.hidden, a.blocks, a.vocab, a.arch, a.model_vocab)
        counter = [0]
        names = a.kinds.split(",")
        runs = {
            n: contender(n, info, root, steps, a.batch_size, a.max_length, env, counter, a.precision) for n in names
        }
        res: dict[str, list[dict]] = {n: [] for n in names}
        for rep in range(reps):
            for n in order_for(rep, names):
                log(f"rep {rep + 1}/{reps}: {n} ...")
                res[n].append(runs[n]())
        result = {
            "machine": machine,
            "argv": sys.argv[1:],
            "reps": reps,
            "steps": steps,
            "batch_size": a.batch_size,
            "max_length": a.max_length,
            "precision": a.precision,
            "threads": a.threads,
            "setup": info,
            "raw": res,
            "median": {},
            "ratios": {},
        }
        for n in names:
            result["median"][n] = {
                k: median([r[k] for r in res[n] if r.get(k) is not None])
                for k in ("samples_per_s", "tokens_per_s", "train_runtime_s", "wall_s")
            }
            for k in ("imports_s", "setup_s", "train_call_s", "save_s", "peak_memory_gb"):
                if res[n][0].get(k) is not None:
                    result["median"][n][k] = median([r[k] for r in res[n]])
        pairs = (("llrd", "flat"), ("flat", "trl"), ("llrd", "trl"), ("packed", "trl"), ("packed", "flat"),
                 ("flat", "padded"))  # fmt: skip
        for num, den in [(x, y) for x, y in pairs if x in names and y in names]:
            per = {}
            for k in ("samples_per_s", "tokens_per_s", "wall_s"):
                rr = [x[k] / y[k] for x, y in zip(res[num], res[den]) if x.get(k) and y.get(k)]
                per[k] = {"median": median(rr), "min_max": spread(rr)}
            result["ratios"][f"{num}/{den}"] = per
        r_lf = result["ratios"].get("llrd/flat", {}).get("samples_per_s", {}).get("median")
        r_ft = result["ratios"].get("flat/trl", {}).get("samples_per_s", {}).get("median")
        result["targets"] = {
            "llrd/flat >= 0.97": r_lf is not None and r_lf >= 0.97,
            "flat/trl >= 0.95": r_ft is not None and r_ft >= 0.95,
        }
        if a.out_json:
            a.out_json.write_text(json.dumps(result, indent=1, default=str))
        mach = result["machine"]
        lines = [
            f"SFT throughput, {steps} steps × batch {a.batch_size}, max length {a.max_length}, {a.precision}, "
            f"OMP_NUM_THREADS={a.threads or 'unset'}; model {a.arch} hidden "
            f"{a.hidden}, {a.blocks} blocks, vocab {info['model_vocab']} "
            f"({fmt_count(info['params'])} params); {info['rows']} Alpaca rows "
            f"(median {info['tokens_per_row_median']} tokens); "
            f"median of {reps} rotated repetitions"
        ]
        for n in names:
            md = result["median"][n]
            lines.append(
                f"  {n:5s} {md['samples_per_s']:7.3f} samples/s  {md['tokens_per_s'] or float('nan'):8.1f} tokens/s  "
                f"train_runtime {md['train_runtime_s']:6.2f} s  wall {md['wall_s']:6.2f} s"
                + (
                    f"  (TRL script: imports {md['imports_s']:.2f} s, setup "
                    f"{md['setup_s']:.2f} s, save {md['save_s']:.2f} s)"
                    if "imports_s" in md
                    else ""
                )
            )
        for key, per in result["ratios"].items():
            lines.append(
                f"  {key:10s} samples/s {per['samples_per_s']['median']:.3f} (min "
                f"{per['samples_per_s']['min_max'][0]:.3f}, "
                f"max {per['samples_per_s']['min_max'][1]:.3f})   tokens/s "
                f"{per['tokens_per_s']['median']:.3f}   wall {per['wall_s']['median']:.3f}"
            )
        lines.append(
            f"  targets: llrd/flat ≥ 0.97 {'met' if result['targets']['llrd/flat >= 0.97'] else 'NOT met'}; "
            f"flat/TRL ≥ 0.95 {'met' if result['targets']['flat/trl >= 0.95'] else 'NOT met'}"
        )
        lines.append(
            f"machine: {mach['nproc']} CPUs ({mach['cpu']}), torch {mach['torch']}, "
            f"transformers {mach.get('transformers')}, "
            f"trl {mach.get('trl')}, load at start {mach.get('loadavg_at_start')}, {mach['date']}"
        )
        emit(result, a.json, "\n".join(lines))
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
