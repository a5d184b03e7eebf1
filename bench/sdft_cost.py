"""The CPU cost of `posttrainllm sdft` against a bare TRL SDFTTrainer loop (what a user writes by hand), same model,
rows, batch, completion length, teacher, divergence, LR, seed and precision; rotated order, median of the
per-repetition ratios of the trainer's own seconds per step (its `train_runtime`, so process start and model load
are not counted on either side).

    python bench/sdft_cost.py [--model DIR] [--steps 6] [--reps 3] [--threads 1] [--json]

Model: bench/smollm2.py's converted SmolLM2-135M-Instruct unless --model. Data: the first 64 rows of Alpaca
(../shared/data/alpaca_en_demo.json) as prompt + demonstration with Stanford Alpaca's template, the rows sdft
itself makes of them (posttrainllm/data/demonstrations.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ALPACA_PROMPT,
    ALPACA_PROMPT_NO_INPUT,
    base_parser,
    converted_model,
    emit,
    machine_info,
    median,
    order_for,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
SETTINGS = dict(batch=4, completion=32, lr=1e-5, seed=0, rate=0.01, alpha=1.0)


def bare_worker(model_dir: str, data: str, out: str, steps: int) -> None:
    """The bare loop: SDFTConfig with the settings sdft passes, the rest TRL's defaults."""
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.sdft import SDFTConfig, SDFTTrainer

    s = SETTINGS
    args = SDFTConfig(
        output_dir=out, max_steps=steps, per_device_train_batch_size=s["batch"], num_generations=1,
        max_completion_length=s["completion"], teacher_model_kind="ema", teacher_update_rate=s["rate"],
        distillation_alpha=s["alpha"], learning_rate=s["lr"], seed=s["seed"], report_to="none", save_strategy="no",
        use_cpu=True, bf16=False, logging_steps=1, disable_tqdm=True, optim="adamw_torch_fused",
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = SDFTTrainer(model=model, args=args, train_dataset=load_dataset("json", data_files=data)["train"],
                          processing_class=tok)  # fmt: skip
    metrics = trainer.train().metrics
    print("BARE_RESULT " + json.dumps({"seconds_per_step": metrics["train_runtime"] / steps}))


def write_rows(root: Path, n: int = 64) -> tuple[Path, Path]:
    """(Alpaca records for sdft, the same rows as prompt + privileged_context for the bare loop)."""
    records = json.loads((SHARED / "alpaca_en_demo.json").read_text())[:n]
    alpaca, demos = root / "alpaca.json", root / "demos.jsonl"
    alpaca.write_text(json.dumps(records))
    with open(demos, "w") as f:
        for r in records:
            tpl = ALPACA_PROMPT if r.get("input") else ALPACA_PROMPT_NO_INPUT
            prompt = tpl.format(instruction=r["instruction"], input=r.get("input", ""))
            f.write(json.dumps({"prompt": prompt, "privileged_context": r["output"]}) + "\n")
    return alpaca, demos


def ours(model_dir: str, data: Path, out: Path, steps: int, env: dict) -> float:
    s = SETTINGS
    argv = [sys.executable, "-m", "posttrainllm", "sdft", "--model", model_dir, "--dataset", str(data),
            "--output-dir", str(out), "--overwrite", "--max-steps", str(steps), "--batch-size", str(s["batch"]),
            "--max-completion-length", str(s["completion"]), "--lr", str(s["lr"]), "--seed", str(s["seed"]),
            "--precision", "fp32", "--save-steps", "100000", "--forgetting-probe", "0"]  # fmt: skip
    subprocess.run(argv, check=True, env=env, capture_output=True)
    state = json.loads((out / "trainer_state.json").read_text())
    runtime = next(h["train_runtime"] for h in state["log_history"] if "train_runtime" in h)
    return runtime / steps


def bare(model_dir: str, data: Path, out: Path, steps: int, env: dict) -> float:
    argv = [sys.executable, __file__, "--worker", model_dir, str(data), str(out), str(steps)]
    done = subprocess.run(argv, check=True, env=env, capture_output=True, text=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("BARE_RESULT "))
    return json.loads(line.removeprefix("BARE_RESULT "))["seconds_per_step"]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        bare_worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    ap = base_parser(__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    model_dir = converted_model(a.model, "smollm2.py")
    import os

    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRL_EXPERIMENTAL_SILENCE": "1"}  # fmt: skip
    times: dict[str, list[float]] = {"sdft": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        alpaca, demos = write_rows(root)
        for rep in range(a.reps or 3):
            for name in order_for(rep, list(times)):
                fn = ours if name == "sdft" else bare
                times[name].append(fn(model_dir, alpaca if name == "sdft" else demos, root / name, a.steps, env))
    ratio = median([o / b for o, b in zip(times["sdft"], times["bare"])])
    result = {"machine": machine_info(), "settings": SETTINGS, "steps": a.steps, "threads": a.threads,
              "seconds_per_step": times, "ratio_median": ratio, "model": model_dir}  # fmt: skip
    text = f"seconds per step, sdft: {times['sdft']}, bare SDFTTrainer: {times['bare']}\n"
    text += f"posttrainllm sdft / bare SDFTTrainer per step: median {ratio:.3f}, {a.reps or 3} rotated repetitions"
    emit(result, a.json, text)


if __name__ == "__main__":
    main()
