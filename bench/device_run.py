"""One prepared run for a lent GPU machine (one H200-class GPU, 8 minutes), and its CPU dry mode.

    python bench/device_run.py OUT                 # on the GPU machine, under 8 minutes
    python bench/device_run.py OUT --dry-run       # on a CPU at a tiny size, under 2 minutes (tests/ runs it)
    bash bench/device_run.sh OUT [WHEELS_DIR]      # the same, first installing the wheels the GPU machine lacks

Two parts, each under its own time limit, so that a part that fails or runs out of time leaves the other's results:

1. **Performance** (bench/throughput.py): `posttrainllm sft` flat, `--llrd 0.9` and `--packing` against a bare TRL
   `SFTTrainer`, on a llama-shaped model of about 0.5B parameters built from a config (hidden 1536, 16 blocks,
   vocab 2048 from the benchmark's BPE tokenizer), bf16, sequence length 1024. Then the **Gemma-sized case**: a
   Gemma-3-shaped model at Gemma-3-270M's size (hidden 640, 18 blocks, sliding-window layers, a tied 262,144-row
   embedding: the LM head is the step's largest tensor), sft at its default (padding-free where exact) against the
   padded batch (`--no-padding-free`) and the bare TRL script. Reported: tokens/s, MFU (6·N FLOPs per token over the
   GPU's dense bf16 peak, `--peak-tflops`), peak GPU memory, and the ratios (the layer-decay optimizer's cost is the
   llrd/flat ratio; padding-free's gain is flat/padded).
2. **Evidence**: a base pre-trained here on the shared text (Tiny Shakespeare and the training half of the stdlib
   code) for a few minutes, at a width the CPU cannot reach, then one `posttrainllm sweep sft` on Alpaca: flat at
   three LRs, layer decay, the KL anchor and merges back toward the base (uniform and depth-scaled), every point
   measured the same way (in-domain eval loss; held-out code, prose and Shakespeare perplexity and KL to the base).
   Twice: on a llama-shaped base, then on a **Gemma-3-shaped stand-in** (Gemma-3-270M's body, 640 wide, 18 blocks
   with every sixth one full attention and the rest sliding-window, tied embeddings; the vocabulary is the
   pre-trained tokenizer's, since the real model's 230 MB GGUF cannot travel), so the method comparison is made on
   both families' shapes in one run. On the Gemma-shaped base the first sweep also gives each cell's budgeted
   point (`--max-forgetting 5`), and the method sweeps that follow it at the middle LR, into the same folder, add
   DFT with and without the KL anchor, replay 5%, self-replay, `sdft` and layer decay's second setting (γ 0.97):
   every method of the CPU study's comparison, at a width and step count the CPU cannot reach. In dry mode those
   method sweeps are checked, not run (`sweep --dry-run`).

Writes OUT/summary.json and OUT/summary.md (and each part's own files). Nothing is downloaded: the data is
../shared/data (or a copy next to OUT given by --shared), models are built from configs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))

# (real, dry-run) sizes and limits
SIZES = {
    "real": dict(
        hidden=1536, blocks=16, batch=8, length=1024, steps=30, reps=2, precision="bf16", perf_timeout=120,
        gemma_hidden=640, gemma_blocks=18, gemma_vocab=262_144, gemma_batch=8, gemma_steps=20, gemma_timeout=100,
        pre_hidden=768, pre_blocks=12, pre_steps=1500, pre_batch=32, sft_steps=150, lrs="3e-5,1e-4,3e-4",
        gammas="1.0,0.9", kls="0,0.1", merge_gammas="1.0,0.9", study_timeout=130, chars=400_000,
        gemma_pre_hidden=640, gemma_pre_blocks=18, gemma_pre_steps=800, gemma_window=128, gemma_study_timeout=110,
        self_replay=64, second_gamma="0.97", dry_methods=False, main_share=0.6,
    ),
    "dry": dict(
        hidden=64, blocks=2, batch=2, length=64, steps=2, reps=1, precision="fp32", perf_timeout=300,
        gemma_hidden=64, gemma_blocks=2, gemma_vocab=4096, gemma_batch=2, gemma_steps=2, gemma_timeout=300,
        pre_hidden=32, pre_blocks=2, pre_steps=4, pre_batch=4, sft_steps=2, lrs="3e-3", gammas="1.0",
        kls="0,0.1", merge_gammas="1.0", study_timeout=400, chars=20_000,
        gemma_pre_hidden=64, gemma_pre_blocks=6, gemma_pre_steps=4, gemma_window=16, gemma_study_timeout=400,
        self_replay=4, second_gamma="0.97", dry_methods=True, main_share=0.95,
    ),
}  # fmt: skip
# The real run's limits add to 7.7 minutes (120 + 100 + 130 + 110 s), inside the 8 a command may take.
# The dry run takes under 2 minutes on a quiet 2-core CPU; its caps are generous so that a loaded machine (a CI
# runner beside other jobs) still finishes it: they guard against a hang, not against slowness.


def run(cmd: list[str], log: Path, timeout: int, env: dict | None = None) -> dict:
    """A part as a process with a time limit; its exit, time and the tail of its log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    return {"rc": rc, "seconds": round(time.time() - t0, 1), "log": str(log), "tail": tail}


def performance(out: Path, s: dict, env: dict, peak_tflops: float, gemma: bool = False) -> dict:
    """One throughput.py run: the llama-shaped case, or (`gemma`) the Gemma-sized one with the padded contender."""
    name = "gemma" if gemma else "throughput"
    dest = out / f"{name}.json"
    g = "gemma_" if gemma else ""
    cmd = [
        sys.executable, str(ROOT / "bench" / "throughput.py"), "--json", "--precision", s["precision"],
        "--hidden", str(s[f"{g}hidden"]), "--blocks", str(s[f"{g}blocks"]), "--batch-size", str(s[f"{g}batch"]),
        "--max-length", str(s["length"]), "--steps", str(s[f"{g}steps"]), "--reps", str(s["reps"]),
        "--rows", str(max(64, s[f"{g}batch"] * s[f"{g}steps"])), "--threads", "0",
        "--kinds", "flat,padded,trl" if gemma else "llrd,flat,packed,trl",
    ]  # fmt: skip
    if gemma:
        cmd += ["--arch", "gemma3", "--model-vocab", str(s["gemma_vocab"])]
    timeout = s["gemma_timeout" if gemma else "perf_timeout"]
    status = run(cmd + ["--out-json", str(dest)], out / f"{name}.log", timeout, env)
    if not dest.is_file():
        return {"status": status}
    res = json.loads(dest.read_text())
    params = res["setup"]["params"]
    rows = {}
    for kind, md in res["median"].items():
        tps = md.get("tokens_per_s")
        rows[kind] = {
            "tokens_per_s": tps,
            "mfu": (6 * params * tps / (peak_tflops * 1e12)) if tps else None,
            "peak_memory_gb": md.get("peak_memory_gb"),
        }
    return {"status": status, "params": params, "rows": rows, "ratios": res["ratios"]}


def base_config(s: dict, arch: str) -> dict:
    """The pre-trained base's config: llama-shaped, or a Gemma-3-shaped stand-in (head dim 256, one KV head, every
    sixth block full attention and the rest a sliding window, tied embeddings: Gemma-3-270M's proportions)."""
    if arch == "gemma3":
        hidden, blocks = s["gemma_pre_hidden"], s["gemma_pre_blocks"]
        return {
            "model_type": "gemma3_text", "hidden_size": hidden, "intermediate_size": hidden * 3,
            "num_hidden_layers": blocks, "num_attention_heads": max(1, hidden // 160), "num_key_value_heads": 1,
            "head_dim": 256 if hidden >= 256 else 32, "max_position_embeddings": 512,
            "sliding_window": s["gemma_window"], "tie_word_embeddings": True,
            "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(blocks)],
        }  # fmt: skip
    heads = max(2, s["pre_hidden"] // 64)
    return {
        "model_type": "llama", "hidden_size": s["pre_hidden"], "intermediate_size": int(s["pre_hidden"] * 2.75),
        "num_hidden_layers": s["pre_blocks"], "num_attention_heads": heads, "num_key_value_heads": heads,
        "max_position_embeddings": 512, "tie_word_embeddings": False,
    }  # fmt: skip


def evidence(out: Path, s: dict, env: dict, shared: Path, arch: str = "llama") -> dict:
    from common import splits

    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    sp = splits(shared)
    chars = s["chars"]
    (data / "pretrain.txt").write_text(sp["shakespeare_train"][: chars * 2] + "\n\n" + sp["code_train"][: chars * 2])
    for key in ("code_held", "docs_held", "shakespeare_held"):
        (data / f"{key}.txt").write_text(sp[key][: min(chars // 10, 40_000)])
    (data / "replay.txt").write_text(sp["docs_train"][:chars])  # replay: documentation text no held-out set has
    (data / "alpaca_train.json").write_text(json.dumps(sp["alpaca_train"]))
    (data / "alpaca_val.json").write_text(json.dumps(sp["alpaca_val"]))
    config = data / "config.json"
    config.write_text(json.dumps(base_config(s, arch)))
    gemma = arch == "gemma3"
    timeout = s["gemma_study_timeout" if gemma else "study_timeout"]
    cli = [sys.executable, "-m", "posttrainllm"]
    base = out / "base"
    t0 = time.time()
    pre = run(
        [*cli, "pretrain", "--dataset", str(data / "pretrain.txt"), "--output-dir", str(base), "--overwrite",
         "--model-config", str(config), "--vocab-size", "2048", "--max-length", "256", "--batch-size",
         str(s["pre_batch"]), "--lr", "1e-3", "--lr-scheduler", "cosine", "--warmup-ratio", "0.05", "--max-steps",
         str(s["gemma_pre_steps" if gemma else "pre_steps"]), "--save-steps", "100000", "--logging-steps", "50"],
        out / "pretrain.log", timeout // 2, env,
    )  # fmt: skip
    if pre["rc"] != 0:
        return {"arch": arch, "pretrain": pre}
    left = max(30, timeout - int(time.time() - t0))
    sweep_dir = out / "sweep"
    ood = [
        a for key in ("code_held", "docs_held", "shakespeare_held") for a in ("--ood-eval", str(data / f"{key}.txt"))
    ]
    # what every sweep of this base shares: the model, the data, the held-out texts, the run's length
    shared = [
        "--model", str(base), "--dataset", str(data / "alpaca_train.json"), "--eval-dataset",
        str(data / "alpaca_val.json"), *ood, "--output-dir", str(sweep_dir), "--max-steps", str(s["sft_steps"]),
        "--batch-size", "8", "--max-length", "256", "--save-steps", "100000", "--discard-weights",
    ]  # fmt: skip
    grid = ["--lr", s["lrs"], "--llrd", s["gammas"], "--kl-to-base", s["kls"], "--merge-alpha", "1.0,0.5"]
    grid += ["--merge-llrd", s["merge_gammas"]] + (["--max-forgetting", "5"] if gemma else [])
    # on the Gemma-shaped base the method sweeps that follow get what the first leaves (on the GPU at least 40%)
    first = int(left * s["main_share"]) if gemma else left
    sw = run([*cli, "sweep", "sft", *shared, *grid], out / "sweep.log", first, env)
    methods = method_sweeps([*cli, "sweep"], shared, s, data, timeout - int(time.time() - t0), env) if gemma else {}
    found = [d / "results.json" for d in (sweep_dir, sweep_dir.with_name("sweep-sdft"))]
    summary = every_point([json.loads(f.read_text()) for f in found if f.is_file()]) or None
    return {"arch": arch, "pretrain": pre, "sweep": sw, "methods": methods, "summary": summary}


def method_sweeps(sweep: list[str], shared: list[str], s: dict, data: Path, left: int, env: dict) -> dict:
    """The rest of the method comparison on the Gemma-shaped base, at the grid's middle LR, into the same sweep
    folder (a sweep run again keeps every earlier point, so results.json holds them all): DFT with and without the
    KL anchor, replay of 5% documentation text, self-replay, `sdft`, and layer decay's second setting, in that
    order, each given the time left. In dry mode each is only checked (`sweep --dry-run`: every cell's command line
    read as the CLI reads it), so that CI proves the command lines without paying for their runs."""
    lrs = s["lrs"].split(",")
    extra = {
        "dft": ["sft", "--loss-type", "dft", "--kl-to-base", "0,0.1"],
        "replay": ["sft", "--replay-dataset", str(data / "replay.txt"), "--replay-ratio", "0.05"],
        "self_replay": ["sft", "--self-replay", str(s["self_replay"]), "--replay-ratio", "0.25"],
        "sdft": ["sdft", "--max-completion-length", "64"],
        "llrd": ["sft", "--llrd", s["second_gamma"]],
    }
    out: dict = {}
    t0 = time.time()
    for name, (command, *args) in extra.items():
        rest = left - int(time.time() - t0)
        if rest < 10:
            out[name] = {"rc": "no time left"}
            continue
        own = shared if command != "sdft" else without(shared, "--max-length")  # sdft's lengths are its own
        cmd = [*sweep, command, *own, "--lr", lrs[len(lrs) // 2], *args]
        if command == "sdft":  # its own folder: a sweep names a cell by its axes, and sdft's would be sft's flat
            cmd[cmd.index("--output-dir") + 1] += "-sdft"
        log = data.parent / f"method-{name}.log"
        out[name] = run(cmd + (["--dry-run"] if s["dry_methods"] else []), log, rest, env)
    return out


def every_point(results: list[dict]) -> list[dict]:
    """The points of the sweep folders' results.json files: each one's last sweep and those the earlier sweeps into
    it measured (kept under "earlier", off its own frontier), aggregated as the sweep aggregates its own."""
    from posttrainllm.sweep.results import summarize

    return summarize([r for res in results for r in res["cells"] + res.get("earlier", [])])


def without(args: list[str], flag: str) -> list[str]:
    """`args` less `flag` and its value."""
    i = args.index(flag)
    return args[:i] + args[i + 2 :]


def markdown(result: dict) -> str:
    lines = [f"# Device run ({result['mode']})", "", f"machine: {result['machine']}", ""]
    for key, what in (("performance", "llama-shaped"), ("performance_gemma", "Gemma-3-shaped, 262k vocabulary")):
        lines += _perf_lines(result.get(key) or {}, what)
    lines += _evidence_lines(result.get("evidence") or {}, "llama-shaped base")
    lines += _evidence_lines(result.get("evidence_gemma") or {}, "Gemma-3-shaped base")
    return "\n".join(lines) + "\n"


def _perf_lines(perf: dict, what: str) -> list[str]:
    if not perf.get("rows"):
        return [f"## Performance, {what}: no result", "", f"```\n{json.dumps(perf.get('status'), indent=1)}\n```", ""]
    lines = [f"## Performance, {what} ({perf['params'] / 1e6:.0f}M parameters)", ""]
    lines += ["| contender | tokens/s | MFU | peak memory (GB) |", "|---|---|---|---|"]
    for kind, r in perf["rows"].items():
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        mem = "-" if r["peak_memory_gb"] is None else f"{r['peak_memory_gb']:.1f}"
        lines.append(f"| {kind} | {r['tokens_per_s'] or 0:.0f} | {mfu} | {mem} |")
    ratios = [f"- {k}: tokens/s {v['tokens_per_s']['median']:.3f}" for k, v in perf["ratios"].items()]
    return [*lines, "", *ratios, ""]


def _evidence_lines(ev: dict, what: str) -> list[str]:
    lines = [f"## Evidence, {what}", ""]
    if ev.get("summary"):
        lines += ["| method | LR | eval loss | forgetting % |", "|---|---|---|---|"]
        for r in sorted(ev["summary"], key=lambda r: (r["method"], r["lr"])):
            f = "-" if r["forgetting_pct"] is None else f"{r['forgetting_pct']:+.1f}"
            own = " (SDFT's own objective, not NLL)" if r.get("command") == "sdft" else ""
            lines.append(f"| {r['method']} | {r['lr']:g} | {r['eval_loss']:.4f}{own} | {f} |")
    else:
        lines += ["no result", "", f"```\n{json.dumps({k: v for k, v in ev.items() if k != 'summary'}, indent=1)}\n```"]
    for name, status in (ev.get("methods") or {}).items():  # the method sweeps of the Gemma-shaped base
        took = f", {status['seconds']} s" if "seconds" in status else ""
        lines.append(f"- method sweep {name}: rc {status['rc']}{took}")
    return [*lines, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, under 2 minutes")
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data", help="the shared data folder")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16 peak (H100/H200: 989)")
    ap.add_argument("--parts", default="performance,evidence")
    a = ap.parse_args()
    mode = "dry" if a.dry_run else "real"
    s = SIZES[mode]
    a.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if a.dry_run:
        env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    else:
        import torch

        assert torch.cuda.is_available(), "no CUDA device: use --dry-run on a CPU"
    from common import machine

    result: dict = {"mode": mode, "machine": machine(), "sizes": s}
    parts = a.parts.split(",")
    if "performance" in parts:
        result["performance"] = performance(a.out / "performance", s, env, a.peak_tflops)
        result["performance_gemma"] = performance(a.out / "performance", s, env, a.peak_tflops, gemma=True)
    if "evidence" in parts:
        result["evidence"] = evidence(a.out / "evidence", s, env, a.shared)
        result["evidence_gemma"] = evidence(a.out / "evidence_gemma", s, env, a.shared, arch="gemma3")
    (a.out / "summary.json").write_text(json.dumps(result, indent=2, default=str))
    (a.out / "summary.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
