"""Real-size throughput: posttrainllm vs a bare TRL SFTTrainer on SmolLM2-135M-Instruct (30 blocks), and packing vs
TRL's default padded batches in useful (non-pad) tokens per second, with the eval loss at equal tokens seen.

    python bench/real_throughput.py [--json] [--part overhead,padding] [--reps 2] [--threads 2]
    python bench/real_throughput.py --model DIR --dataset ALPACA.json     # other model / data (independent re-run)

Data: Alpaca (../shared/data/alpaca_en_demo.json; first 900 rows train, last 99 validation, as its README suggests),
written once as prompt/completion JSONL with Stanford Alpaca's template, so that every contender reads the very
same rows and TRL tokenizes them the same way. Model: bench/smollm2.py's converted directory unless --model.

Part "overhead" (issue #23 item 1): `posttrainllm sft` (flat), `posttrainllm sft --llrd 0.9` and the bare TRL script
(bench/throughput.py's worker: what a user writes by hand), same batch, length, steps, seed, LR, precision
(--precision: fp32 unless told; bf16 for a GPU, bench/gpu_bench.sh; auto for each side's own default), no checkpoint
during training but the one at the last step that both write; rotated order, median of per-repetition ratios of the
trainer's samples/s and tokens/s.

Part "padding" (item 3): TRL's default path (no packing: each batch padded to its longest row) against
`posttrainllm sft --packing` (best-fit-decreasing, padding-free) at the same batch size and max length. The packed
run takes fewer steps, chosen so that both see about the same number of useful tokens; both then score the 99
validation rows with `posttrainllm eval --sft-dataset` (mean completion-token loss). A third contender,
`--packing --batch-size 1 --grad-accum B`, feeds one packed row per forward: TRL's BFD packing is always
padding-free, i.e. a batch of B packed rows is one flattened sequence of B × max-length tokens under a
block-diagonal mask, and on a CPU (sdpa, no variable-length kernels) that attention costs (B·L)² rather than B·L².
Useful tokens/s is TRL's
`num_tokens` (non-pad tokens) over the train runtime; the TRL worker also counts the padded tokens it was fed.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ALPACA_PROMPT, ALPACA_PROMPT_NO_INPUT  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
RESULT_TAG = "TRL_RESULT "
LR = 2e-5


def trl_worker(model_dir, dataset, out, steps, batch, max_length, precision="fp32") -> None:
    """The bare TRL script with TRL's defaults (no packing; TRL's default save strategy, "steps", which writes a
    checkpoint at the last step as posttrainllm's runs do), counting the tokens its collator pads. Two of
    SFTConfig's defaults differ from posttrainllm's and are set to ours, so that both run the same arithmetic: bf16
    (TRL's default, autocast on a CPU; posttrainllm's `auto` is fp32 on a CPU without bf16 units) and activation
    checkpointing (TRL's default on; posttrainllm's --gradient-checkpointing off). `precision` is the run's, as
    posttrainllm applies it: bf16 loads bf16 weights on a GPU and autocasts over fp32 weights on a CPU. "auto" is
    each side's own default instead: SFTConfig's bf16, activation checkpointing and optimizer (fused AdamW) as they
    come, fp32 weights."""
    import time

    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    ds = load_dataset("json", data_files=dataset, split="train")
    tok = AutoTokenizer.from_pretrained(model_dir)
    on_gpu = torch.cuda.is_available()
    dtype = torch.bfloat16 if precision == "bf16" and on_gpu else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    ours = {"bf16": precision == "bf16", "activation_checkpointing": False}  # the optimizer: fused AdamW both
    args = SFTConfig(
        output_dir=out, max_steps=steps, per_device_train_batch_size=batch, max_length=max_length, learning_rate=LR,
        seed=42, report_to=[], logging_steps=10, use_cpu=not on_gpu, **({} if precision == "auto" else ours),
    )  # fmt: skip
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    fed = {"positions": 0, "real": 0}
    collate = trainer.data_collator

    def counting(rows):
        b = collate(rows)
        fed["positions"] += b["input_ids"].numel()
        fed["real"] += int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()
        return b

    trainer.data_collator = counting
    t0 = time.perf_counter()
    metrics = trainer.train().metrics
    train_s = time.perf_counter() - t0
    trainer.save_model(out)
    tok.save_pretrained(out)
    toks = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    print(RESULT_TAG + json.dumps({"metrics": metrics, "num_tokens": toks[-1], "fed": fed, "train_call_s": train_s}))


def write_data(root: Path, dataset: Path, chat: bool = False) -> dict[str, Path]:
    """Alpaca as prompt/completion rows (train: all but the last 99 rows; val: those). `chat`: as conversations of
    mixed lengths instead, 1, 2 or 3 consecutive Alpaca pairs as user/assistant turns (in turn), for the models'
    chat templates."""
    rows = json.loads(dataset.read_text(encoding="utf-8"))

    def prompt(r):
        tpl = ALPACA_PROMPT if r.get("input", "").strip() else ALPACA_PROMPT_NO_INPUT
        return tpl.format(instruction=r["instruction"], input=r.get("input", ""))

    def as_rows(part):
        if not chat:
            return [{"prompt": prompt(r), "completion": r["output"]} for r in part]
        out, i = [], 0
        while i < len(part):
            turns = part[i : i + 1 + len(out) % 3]
            i += len(turns)
            msgs = [m for r in turns for m in ({"role": "user", "content": prompt(r)},
                                               {"role": "assistant", "content": r["output"]})]  # fmt: skip
            out.append({"messages": msgs})
        return out

    out = {"train": root / "train.jsonl", "val": root / "val.jsonl"}
    cut = max(1, len(rows) - 99)
    for key, part in (("train", rows[:cut]), ("val", rows[cut:])):
        out[key].write_text("".join(json.dumps(r) + "\n" for r in as_rows(part)), encoding="utf-8")
    return out


def token_counts(model_dir: str, train: Path, max_length: int) -> tuple[float, float]:
    """(mean tokens per training example, mean tokens per packed row): examples as TRL tokenizes them (prompt +
    completion + EOS, cut at max_length), rows as TRL's best-fit-decreasing packing fills them."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.data_utils import pack_dataset

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in train.read_text(encoding="utf-8").splitlines()]

    def length(r):
        if "messages" in r:
            return len(tok.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"])
        return len(tok(r["prompt"] + r["completion"]).input_ids) + 1

    n = [min(max_length, length(r)) for r in rows]
    packed = pack_dataset(Dataset.from_dict({"input_ids": [[0] * k for k in n]}), max_length, strategy="bfd")
    return sum(n) / len(n), sum(n) / len(packed)


def model_and_env(model: str | None, threads: int) -> tuple[str, dict[str, str]]:
    """The model directory (`model`, else bench/smollm2.py's converted SmolLM2) and the environment of every run:
    offline, quiet, `threads` threads."""
    from common import converted_model

    model_dir = converted_model(model)
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    env.update(PYTHONWARNINGS="ignore", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return model_dir, env


def ours_argv(kind, data, model_dir, out, steps, batch, max_length, precision="fp32") -> list[str]:
    """The `posttrainllm sft` command line of a contender (flat, llrd, packed, flat_adamw, packed_accum)."""
    from common import VENV_BIN

    exe = VENV_BIN / "posttrainllm"
    argv = [str(exe) if exe.exists() else "posttrainllm", "sft", "--model", model_dir, "--dataset",
            str(data["train"]), "--output-dir", str(out), "--max-steps", str(steps), "--batch-size", str(batch),
            "--max-length", str(max_length), "--precision", precision, "--save-steps", str(steps + 1000),
            "--logging-steps", "10", "--lr", str(LR), "--seed", "42"]  # fmt: skip
    argv += {"llrd": ["--llrd", "0.9"], "packed": ["--packing"], "flat_adamw": ["--optim", "adamw_torch"],
             "padded": ["--no-padding-free"]}.get(kind, [])  # fmt: skip
    if kind == "packed_accum":  # one packed row per forward, the same rows per step through accumulation
        argv[argv.index("--batch-size") + 1] = "1"
        argv += ["--packing", "--grad-accum", str(batch)]
    return argv


def trl_argv(data, model_dir, out, steps, batch, max_length, precision="fp32") -> list[str]:
    """The bare TRL script's command line (this file's `trl_worker` in a fresh process)."""
    return [sys.executable, __file__, "--trl-worker", model_dir, str(data["train"]), str(out), str(steps), str(batch),
            str(max_length), precision]  # fmt: skip


def run(kind, data, model_dir, root, steps, batch, max_length, env, tag, precision="fp32") -> dict:
    from common import run_cmd

    out = root / f"{tag}_{kind}"
    if kind == "trl":
        argv = trl_argv(data, model_dir, out, steps, batch, max_length, precision)
    else:
        argv = ours_argv(kind, data, model_dir, out, steps, batch, max_length, precision)
    wall, proc = run_cmd(argv, env=env, timeout=7200)
    if kind == "trl":
        r = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG))[len(RESULT_TAG) :])
        metrics, num_tokens, fed = r["metrics"], r["num_tokens"], r["fed"]
    else:
        metrics = json.loads((out / "eval_results.json").read_text())["train"]
        state = json.loads((out / "trainer_state.json").read_text())
        num_tokens = [h["num_tokens"] for h in state["log_history"] if "num_tokens" in h][-1]
        fed = None
    rt = metrics["train_runtime"]
    return {
        "out": str(out), "wall_s": wall, "train_runtime_s": rt, "steps": steps,
        "samples_per_s": metrics["train_samples_per_second"], "steps_per_s": steps / rt,
        "tokens_per_s": num_tokens / rt, "num_tokens": num_tokens, "train_loss": metrics.get("train_loss"), "fed": fed,
    }  # fmt: skip


def eval_loss(out: str, val: Path, max_length: int, env: dict) -> float:
    from common import VENV_BIN, run_cmd

    exe = VENV_BIN / "posttrainllm"
    argv = [str(exe) if exe.exists() else "posttrainllm", "eval", "--model", out, "--sft-dataset", str(val),
            "--max-length", str(max_length), "--json"]  # fmt: skip
    _, proc = run_cmd(argv, env=env, timeout=3600)
    try:
        res = json.loads(proc.stdout[proc.stdout.index("{") :])
        return next(v["loss"] for v in res.values() if isinstance(v, dict) and "loss" in v)
    except (ValueError, StopIteration):  # a data set eval does not score: the speed figures stand without it
        return None


def part_overhead(a, data, model_dir, root, env, log, median, order_for) -> dict:
    names = a.overhead_kinds.split(",")
    res = {n: [] for n in names}
    for rep in range(a.reps):
        for n in order_for(rep, names):
            log(f"overhead rep {rep + 1}/{a.reps}: {n} ...")
            r = run(n, data, model_dir, root, a.steps, a.batch_size, a.max_length, env, f"o{rep}", a.precision)
            shutil.rmtree(r.pop("out"), ignore_errors=True)
            res[n].append(r)
    ratios = {}
    for num, den in (("flat", "trl"), ("llrd", "flat"), ("llrd", "trl"), ("flat", "flat_adamw")):
        if num not in names or den not in names:
            continue
        ratios[f"{num}/{den}"] = {
            k: median([x[k] / y[k] for x, y in zip(res[num], res[den])])
            for k in ("steps_per_s", "samples_per_s", "tokens_per_s")
        }
        ratios[f"{num}/{den}"]["per_rep_samples"] = [
            round(x["samples_per_s"] / y["samples_per_s"], 4) for x, y in zip(res[num], res[den])
        ]
    return {"raw": res, "ratios": ratios}


def part_padding(a, data, model_dir, root, env, log) -> dict:
    mean, per_row = token_counts(model_dir, data["train"], a.pad_max_length)
    packed_steps = max(1, round(a.pad_steps * mean / per_row))  # about the same useful tokens as TRL's run
    log(f"padding: {mean:.1f} tokens per example, {per_row:.1f} per packed row; TRL {a.pad_steps} steps, packed "
        f"{packed_steps} steps")  # fmt: skip
    res = {}
    kinds = a.pad_kinds.split(",")
    # flat: sft at its defaults (padding-free where exact); padded: --no-padding-free; both TRL's rows and steps
    runs = (("trl", a.pad_steps), ("flat", a.pad_steps), ("padded", a.pad_steps), ("packed", packed_steps),
            ("packed_accum", packed_steps))  # fmt: skip
    for kind, steps in runs:
        if kind not in kinds:
            continue
        log(f"padding: {kind} ({steps} steps) ...")
        res[kind] = run(kind, data, model_dir, root, steps, a.pad_batch_size, a.pad_max_length, env, "p", a.precision)
        log(f"padding: eval {kind} ...")
        res[kind]["eval_loss"] = eval_loss(res[kind]["out"], data["val"], a.pad_max_length, env)
        shutil.rmtree(res[kind].pop("out"), ignore_errors=True)
    out = {"mean_tokens_per_example": mean, "mean_tokens_per_packed_row": per_row, "raw": res}
    if "trl" not in res:
        return out
    fed = res["trl"]["fed"]
    out["trl_padded_share"] = 1 - fed["real"] / fed["positions"]
    for kind in ("flat", "padded", "packed", "packed_accum"):
        if kind in res:
            out[kind] = {
                "useful_tokens_per_s_ratio": res[kind]["tokens_per_s"] / res["trl"]["tokens_per_s"],
                "tokens_seen_ratio": res[kind]["num_tokens"] / res["trl"]["num_tokens"],
                "eval_loss_difference": None
                if None in (res[kind]["eval_loss"], res["trl"]["eval_loss"])
                else res[kind]["eval_loss"] - res["trl"]["eval_loss"],
            }
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--trl-worker":
        m, d, o, s, b, L, prec = sys.argv[2:9]
        trl_worker(m, d, o, int(s), int(b), int(L), prec)
        return
    from common import base_parser, emit, log, machine_info, median, order_for

    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", help="model directory (default: bench/smollm2.py's converted SmolLM2)")
    p.add_argument("--dataset", default=str(SHARED / "alpaca_en_demo.json"), help="Alpaca-format JSON")
    p.add_argument("--part", default="overhead,padding")
    p.add_argument("--steps", type=int, default=6, help="overhead part: steps per run")
    p.add_argument(
        "--overhead-kinds", default="flat,llrd,trl",
        help="overhead part: flat, llrd (--llrd 0.9), trl (the bare script), flat_adamw (flat with --optim "
        "adamw_torch, the default before fused AdamW)",
    )  # fmt: skip
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-length", type=int, default=192, help="overhead part")
    p.add_argument("--pad-steps", type=int, default=16, help="padding part: TRL's steps")
    p.add_argument("--pad-batch-size", type=int, default=8, help="padding part (TRL's default per-device batch)")
    p.add_argument("--pad-max-length", type=int, default=256, help="padding part")
    p.add_argument(
        "--pad-kinds", default="trl,packed,packed_accum",
        help="padding part: trl (TRL's default padded batches), flat (sft at its defaults: padding-free where "
        "exact), padded (--no-padding-free), packed (--packing, batch B: one flattened row of B packed rows per "
        "forward), packed_accum (--packing --batch-size 1 --grad-accum B)",
    )  # fmt: skip
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chat", action="store_true", help="the rows as conversations of 1-3 turns (mixed lengths)")
    p.add_argument(
        "--precision", choices=["fp32", "bf16", "auto"], default="fp32",
        help="every contender's; auto: each side's default (posttrainllm's --precision auto; TRL's SFTConfig defaults, "
        "bf16 autocast, activation checkpointing, fused AdamW): what a user of each gets",
    )  # fmt: skip
    a = p.parse_args()
    a.reps = a.reps or 2
    model_dir, env = model_and_env(a.model, a.threads)
    machine = machine_info()
    root = Path(tempfile.mkdtemp(prefix="posttrainllm-real-"))
    try:
        data = write_data(root, Path(a.dataset), chat=a.chat)
        result = {"machine": machine, "argv": sys.argv[1:], "model": model_dir, "threads": a.threads}
        parts = a.part.split(",")
        if "overhead" in parts:
            result["overhead"] = part_overhead(a, data, model_dir, root, env, log, median, order_for)
        if "padding" in parts:
            result["padding"] = part_padding(a, data, model_dir, root, env, log)
        emit(result, a.json, report(result, a))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(r: dict, a) -> str:
    load = r["machine"].get("loadavg_at_start")
    lines = [f"model {r['model']}, {a.precision}, OMP_NUM_THREADS={a.threads}, load at start {load}"]
    if "overhead" in r:
        lines.append(f"overhead: {a.steps} steps × batch {a.batch_size}, max length {a.max_length}, {a.reps} reps")
        for key, v in r["overhead"]["ratios"].items():
            lines.append(
                f"  {key:10s} steps/s {v['steps_per_s']:.3f}  samples/s {v['samples_per_s']:.3f}  "
                f"tokens/s {v['tokens_per_s']:.3f}  (per rep {v['per_rep_samples']})"
            )
    if "padding" in r:
        pd, raw = r["padding"], r["padding"]["raw"]
        share = f"; TRL default padded share {pd['trl_padded_share']:.1%}" if "trl_padded_share" in pd else ""
        lines.append(
            f"padding: batch {a.pad_batch_size}, max length {a.pad_max_length}; "
            f"{pd['mean_tokens_per_example']:.0f} tokens per example{share}"
        )
        for k, x in raw.items():
            lines.append(
                f"  {k:6s} {x['steps']:3d} steps  {x['num_tokens']:7.0f} useful tokens  "
                f"{x['tokens_per_s']:7.1f} useful tokens/s  train loss {x['train_loss']:.4f}  "
                f"eval loss {x['eval_loss'] if x['eval_loss'] is None else round(x['eval_loss'], 4)}"
            )
        for k in ("flat", "padded", "packed", "packed_accum"):
            if k in pd:
                lines.append(
                    f"  {k}/TRL useful tokens/s {pd[k]['useful_tokens_per_s_ratio']:.3f} (target ≥ 1.5); tokens seen "
                    f"ratio {pd[k]['tokens_seen_ratio']:.3f}; eval loss {k} − TRL {pd[k]['eval_loss_difference']}"
                )
    m = r["machine"]
    lines.append(f"machine: {m['nproc']} CPUs ({m['cpu']}), torch {m['torch']}, {m['date']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
