"""Find the regime where forgetting happens: a flat LR grid on a real model (SmolLM2-135M-Instruct, or Gemma 3 270M
with --family gemma3) in longer settings.

    python studies/regime.py                       # heal, train and evaluate every cell (hours on 2 cores)
    python studies/regime.py --phase report        # only the table, from what has finished
    python studies/regime.py --seeds 2 --heldout-offset 30000   # an independent replication: other seed, other texts

The first real-model study (studies/real_study.py) ran 30 steps and a tuned flat LR did not forget at all. Forgetting
grows with steps and with how far the new data sits from the old, so this script runs two settings, each with a
flat LR grid, every step the real CLI (one process per run):

  code     `posttrainllm finetune` on the stdlib modules up to typing.py: a shifted domain (code, no chat format).
           In-domain: the held-out stdlib modules (json/*, heapq, ...). Forgetting: prose, Shakespeare, and the
           instruction-following loss on the last 99 Alpaca examples (`eval --sft-dataset`).
  alpaca   `posttrainllm sft` on the first 900 Alpaca examples for one epoch and more (--steps-alpaca). In-domain:
           the last 99 Alpaca examples. Forgetting: code, prose, Shakespeare.
  shakespeare  (--settings shakespeare) `posttrainllm finetune` on the first 90% of Tiny Shakespeare: the farthest
           shift (verse, archaic English, no chat format). In-domain: a slice of the last 10% (after the held-out
           Shakespeare text, which is in-domain here too). Forgetting: code, prose, instruction following.

Both start from the *healed* base (see real_study.py: a short low-LR pass on documentation text that no held-out
set contains, so that Q4 repair is not counted as retention). Every eval set is a fixed file, the same for every
seed. Forgetting is the held-out perplexity change and the mean per-token KL(healed ‖ tuned), by
`posttrainllm eval --reference HEALED`. Results: studies/out/regime/ (not committed); the table goes to
docs/results.md by hand, with this command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))

from common import FAMILIES, cli, machine, model_paths, splits  # noqa: E402

OUT = ROOT / "studies" / "out" / "regime"
HEAL_CHARS = 600_000
COMMON = ["--batch-size", "4", "--max-length", "192", "--save-steps", "100000", "--logging-steps", "10"]
SETTINGS = ("code", "alpaca", "shakespeare")


def family_out(out: Path, family: str) -> Path:
    """A study's output folder for a model family: `out` itself for SmolLM2 (the first study's), `out-FAMILY` else."""
    return out if family == "smollm2" else out.with_name(f"{out.name}-{family}")


def prepare_data(out: Path, heldout_chars: int, offset: int) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    sp = splits()
    texts = {
        "heal": sp["docs_train"][:HEAL_CHARS],
        "code_train": sp["code_train"],
        "code": sp["code_held"][offset : offset + heldout_chars],
        "prose": sp["docs_held"][offset : offset + heldout_chars],
        "shakespeare": sp["shakespeare_held"][offset : offset + heldout_chars],
        # the in-domain eval of the code setting: a longer slice of the held-out modules
        "code_eval": sp["code_held"][offset : offset + 4 * heldout_chars],
        # the shakespeare setting: the first 90% of Tiny Shakespeare to train on, a slice of the last 10% after the
        # held-out one as its in-domain eval
        "shakespeare_train": sp["shakespeare_train"],
        "shakespeare_eval": sp["shakespeare_held"][offset + heldout_chars : offset + 5 * heldout_chars],
    }
    files = {}
    for key, text in texts.items():
        files[key] = out / f"{key}.txt"
        files[key].write_text(text, encoding="utf-8")
    files["alpaca_train"] = out / "alpaca_train.json"
    files["alpaca_val"] = out / "alpaca_val.json"
    files["alpaca_train"].write_text(json.dumps(sp["alpaca_train"]))
    files["alpaca_val"].write_text(json.dumps(sp["alpaca_val"]))
    return files


def grid(seeds: list[int], lrs: list[str], settings: tuple[str, ...] = ("code", "alpaca")) -> list[dict]:
    """The LR nearest 1e-4 first in both settings, then the higher ones (where forgetting shows), then the lower."""
    order = sorted(lrs, key=lambda lr: (abs(float(lr) - 1e-4) > 1e-12, float(lr) < 1e-4, abs(float(lr) - 1e-4)))
    return [
        dict(name=f"{setting}-flat-lr{lr}-s{seed}", setting=setting, lr=lr, seed=seed)
        for seed in seeds
        for lr in order
        for setting in settings
    ]


def heal(files: dict, gguf: Path, out: Path, steps: int) -> Path:
    healed = out / "healed"
    if not (healed / "training_complete.json").is_file():
        print(f"heal: {steps} steps of LM on {files['heal'].name}", flush=True)
        t = cli(
            ["finetune", "--model", str(gguf), "--dataset", str(files["heal"]), "--output-dir", str(healed),
             "--overwrite", "--lr", "2e-5", "--warmup-ratio", "0.1", "--max-steps", str(steps), *COMMON],
            out / "logs" / "heal.log",
        )  # fmt: skip
        print(f"  done in {t:.0f} s", flush=True)
    return healed


def train(cell: dict, files: dict, healed: Path, out: Path, steps: dict) -> Path:
    run_dir = out / "runs" / cell["name"]
    if (run_dir / "training_complete.json").is_file():
        return run_dir
    if cell["setting"] in ("code", "shakespeare"):
        name = cell["setting"]
        data = ["finetune", "--dataset", str(files[f"{name}_train"]), "--eval-dataset", str(files[f"{name}_eval"])]
    else:
        data = ["sft", "--dataset", str(files["alpaca_train"]), "--eval-dataset", str(files["alpaca_val"])]
    print(f"train {cell['name']}", flush=True)
    t = cli(
        [*data, "--model", str(healed), "--output-dir", str(run_dir), "--overwrite", "--lr", cell["lr"],
         "--seed", str(cell["seed"]), "--max-steps", str(steps[cell["setting"]]), "--warmup-ratio", "0.05",
         "--eval-steps", str(steps[cell["setting"]] // 4), *COMMON],
        out / "logs" / f"{cell['name']}.log",
    )  # fmt: skip
    (run_dir / "study_wall_s.txt").write_text(f"{t:.1f}\n")
    print(f"  done in {t:.0f} s", flush=True)
    return run_dir


HELD_OUT = ("code", "prose", "shakespeare")


def evaluate(name: str, model: Path, healed: Path, files: dict, out: Path, keys: tuple[str, ...] = HELD_OUT) -> dict:
    """Held-out PPL + KL to the healed base on the texts `keys` (code, prose, Shakespeare unless told), and the Alpaca
    completion loss; in fp32, whatever the CPU, so that every figure is comparable."""
    dest = out / "eval" / f"{name}.json"
    if dest.is_file():
        return json.loads(dest.read_text())
    args = ["eval", "--model", str(model), "--reference", str(healed), "--max-length", "192", "--json"]
    args += ["--precision", "fp32"]
    for key in keys:
        args += ["--text", str(files[key])]
    args += ["--sft-dataset", str(files["alpaca_val"])]
    print(f"eval {name}", flush=True)
    log = out / "logs" / f"eval-{name}.log"
    # a failed eval leaves no result that looks finished; the process id keeps two studies sharing a folder (one
    # method each, side by side) from renaming each other's file
    partial = dest.with_name(f"{dest.name}.{os.getpid()}.partial")
    t = cli(args, log, stdout=partial)
    partial.replace(dest)
    print(f"  done in {t:.0f} s", flush=True)
    return json.loads(dest.read_text())


def in_domain(run_dir: Path) -> float | None:
    path = run_dir / "eval_results.json"
    if not path.is_file():
        return None
    res = json.loads(path.read_text())
    return (res.get("train") or {}).get("eval_loss", res.get("eval_loss"))


def report(out: Path, cells: list[dict]) -> str:
    """The regime table: per cell, in-domain eval loss, and for each held-out set the PPL change and KL."""
    healed = out / "eval" / "healed.json"
    if not healed.is_file():
        return "(no healed evaluation yet)"
    base = json.loads(healed.read_text())
    keys = sorted(base)
    lines = ["| setting | LR | seed | steps | wall s | in-domain eval loss | " + " | ".join(keys) + " |"]
    lines.append("|" + "---|" * (6 + len(keys)))
    for c in cells:
        run_dir, ev = out / "runs" / c["name"], out / "eval" / f"{c['name']}.json"
        if not ev.is_file():
            continue
        res = json.loads(ev.read_text())
        cols = []
        for k in keys:
            b, r = base[k], res.get(k, {})
            if "perplexity" in b:
                cols.append(f"{100 * (r['perplexity'] / b['perplexity'] - 1):+.1f}% / KL {r.get('kl', 0):.4f}")
            else:
                cols.append(
                    f"{r['loss'] - b['loss']:+.4f} loss ({100 * (math.exp(r['loss'] - b['loss']) - 1):+.1f}% PPL)"
                )
        wall = (run_dir / "study_wall_s.txt").read_text().strip() if (run_dir / "study_wall_s.txt").is_file() else ""
        state_file = run_dir / "trainer_state.json"
        state = json.loads(state_file.read_text()) if state_file.is_file() else {}
        loss = in_domain(run_dir)
        lines.append(
            f"| {c['setting']} | {c['lr']} | {c['seed']} | {state.get('global_step', '')} | {wall} | "
            f"{loss if loss is None else f'{loss:.4f}'} | " + " | ".join(cols) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=["all", "report"], default="all")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--lrs", default="3e-5,1e-4,3e-4")
    ap.add_argument("--settings", default="code,alpaca", help=f"comma-separated, of {', '.join(SETTINGS)}")
    ap.add_argument("--steps-code", type=int, default=240, help="steps of the code and shakespeare settings")
    ap.add_argument("--steps-alpaca", type=int, default=240, help="240 x batch 4 = 960 examples: just over 1 epoch")
    ap.add_argument("--heal-steps", type=int, default=40)
    ap.add_argument("--heldout-chars", type=int, default=8_000)
    ap.add_argument("--heldout-offset", type=int, default=0)
    ap.add_argument("--family", choices=FAMILIES, default="smollm2", help="the real model (bench/FAMILY.py fetches it)")
    ap.add_argument("--out", type=Path, default=None, help=f"default: {OUT} (smollm2), {OUT}-FAMILY (others)")
    args = ap.parse_args()
    out: Path = args.out or family_out(OUT, args.family)
    settings = tuple(args.settings.split(","))
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        ap.error(f"unknown setting(s) {sorted(unknown)}; choose from {', '.join(SETTINGS)}")
    cells = grid([int(s) for s in args.seeds.split(",")], args.lrs.split(","), settings)
    if args.phase == "all":
        files = prepare_data(out / "data", args.heldout_chars, args.heldout_offset)
        gguf, gguf_dir = model_paths(args.family)
        (out / "meta.json").write_text(json.dumps({"machine": machine(), "argv": sys.argv, "grid": cells}, indent=2))
        healed = heal(files, gguf, out, args.heal_steps)
        evaluate("base", gguf_dir, healed, files, out)
        evaluate("healed", healed, healed, files, out)
        steps = {"code": args.steps_code, "alpaca": args.steps_alpaca, "shakespeare": args.steps_code}
        for cell in cells:
            t0 = time.time()
            run_dir = train(cell, files, healed, out, steps)
            evaluate(cell["name"], run_dir, healed, files, out)
            print(f"  cell {cell['name']}: {time.time() - t0:.0f} s", flush=True)
            print(report(out, cells), flush=True)
    print(report(out, cells))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
