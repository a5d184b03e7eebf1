"""The per-step gap to a bare TRL SFTTrainer, by profile: where each side's training-loop time goes, and what
posttrainllm's own code (callbacks, mixins, guards, logging) adds per step.

    OMP_NUM_THREADS=1 python bench/step_profile.py [--json] [--reps 2] [--tiny-steps 30] [--real-steps 8]
        [--real-precisions fp32,bf16] [--skip-tiny] [--skip-real]

Each side runs in its own process under cProfile, switched on only inside transformers'
`Trainer._inner_training_loop` (so model loading and data preparation are not in the profile): `posttrainllm sft`
(flat) and the bare TRL script (bench/real_throughput.py's `trl_worker`), with the same rows, batch, length,
steps, seed, LR and precision, no checkpoint but the one at the last step that both write (it is reported
apart and left out of the per-step figures). Two sizes: a tiny llama built from SmolLM2's config (2 blocks of
width 64, SmolLM2's tokenizer), on which a per-step cost of ours would be visible, and SmolLM2-135M-Instruct at
batch 4 × 192. Per step and side: the loop's time without the final checkpoint, the compute (forward+backward,
gradient norm/clipping, optimizer step, zero_grad), the callbacks (ours and transformers'/TRL's), and every
function of posttrainllm's (a file under posttrainllm/) called in the loop, at its own cost (its time less the
trainer method it extends through super()). Percentages are of the SmolLM2 step of the same precision.
Times are the process's CPU time (cProfile's timer is `time.process_time`): on a shared machine the wall clock
also counts the time the process waits for a core; the loop's wall time is reported beside it. Sides
alternate (rotated order); the loop-time ratio ours/TRL is the median of per-repetition ratios. cProfile slows
Python-heavy code more than the tensor kernels, so our own (Python) costs are, if anything, overstated.
"""

from __future__ import annotations

import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_throughput import SHARED, model_and_env, ours_argv, trl_argv, write_data  # noqa: E402

PKG = os.sep + "posttrainllm" + os.sep
ONCE = ("free_memory", "_prepare_for_training", "get_train_dataloader", "_finalize_training", "get_model_param_count",
        "set_initial_training_values", "_init_training_state")  # fmt: skip
COMPUTE = {"training_step": "forward+backward", "_clip_grad_norm": "grad norm", "_get_grad_norm": "grad norm",
           "zero_grad": "zero_grad"}  # fmt: skip


def worker(side: str, prof_path: str, rest: list[str]) -> None:
    """Run one side with the profiler on inside the training loop only; writes the profile and the loop's time."""
    import cProfile

    import torch
    from transformers import Trainer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    inner = Trainer._inner_training_loop
    prof = cProfile.Profile(time.process_time)  # CPU time: the machine is shared, wall time waits for others

    def profiled(self, *args, **kwargs):
        t0, c0 = time.perf_counter(), time.process_time()
        prof.enable()
        try:
            return inner(self, *args, **kwargs)
        finally:
            prof.disable()
            loop_s, wall_s = time.process_time() - c0, time.perf_counter() - t0
            prof.dump_stats(prof_path)
            meta = {"loop_s": loop_s, "loop_wall_s": wall_s, "steps": self.state.global_step}
            Path(prof_path + ".json").write_text(json.dumps(meta))

    Trainer._inner_training_loop = profiled
    if side == "trl":
        from real_throughput import trl_worker

        m, d, o, s, b, length, prec = rest
        trl_worker(m, d, o, int(s), int(b), int(length), prec)
        return
    from posttrainllm.cli import main as cli_main

    sys.argv = ["posttrainllm", *rest]
    try:
        cli_main()
    except SystemExit as e:
        if e.code:
            raise


def ours(key) -> bool:
    return PKG in key[0] and (os.sep + "bench" + os.sep) not in key[0]


def analyse(prof_path: str) -> dict:
    """Split the loop's time: compute, callbacks (ours / theirs), the final checkpoint, and posttrainllm's own
    functions at their own cost (entry edges from non-posttrainllm callers, less the super() call they wrap)."""
    meta = json.loads(Path(prof_path + ".json").read_text())
    stats = pstats.Stats(prof_path).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    loops = [k for k in stats if k[2] in ("_inner_training_loop", "_run_epoch") and "transformers" in k[0]]
    parts: dict[str, float] = {}
    for key, (_, _, _, _, callers) in stats.items():
        edges = [callers[lp] for lp in loops if lp in callers and key not in loops]
        if not edges:
            continue
        edge = [sum(e[i] for e in edges) for i in range(4)]
        name = key[2]
        if name in COMPUTE:
            part = COMPUTE[name]
        elif (name == "step" and "optimizer" in key[0]) or (name == "wrapper" and "lr_scheduler" in key[0]):
            part = "optimizer step"  # the scheduler wraps optimizer.step to count its calls
        elif name == "step" and "lr_scheduler" in key[0]:
            part = "lr scheduler"
        elif name.startswith("on_") and "trainer_callback" in key[0]:
            part = "callbacks (via the handler)"
        elif name in ONCE:
            part = "once (set-up, finish)"
        elif name == "_maybe_log_save_evaluate":
            part = "log/save/evaluate"
        elif name in ("get_batch_samples", "__next__"):
            part = "data"
        else:
            part = "other (loop body)"
        parts[part] = parts.get(part, 0.0) + edge[3]
    parts["other (loop body)"] = parts.get("other (loop body)", 0.0) + sum(stats[lp][2] for lp in loops)
    save = max((v[3] for k, v in stats.items() if k[2] == "_save_checkpoint" and not ours(k)), default=0.0)
    cb_ours = cb_theirs = 0.0
    for key, (_, _, tt, _, _) in stats.items():
        if key[2] == "call_event" and "trainer_callback" in key[0]:
            cb_theirs += tt  # the handler's own loop
            for callee, (_, _, _, _, ccallers) in stats.items():
                if key in ccallers:
                    if ours(callee):
                        cb_ours += ccallers[key][3]
                    else:
                        cb_theirs += ccallers[key][3]
    own: dict[str, dict] = {}
    for key, (_, _, _, _, callers) in stats.items():
        if not ours(key):
            continue
        entry = [(c, e) for c, e in callers.items() if not ours(c)]
        if not entry:
            continue
        cum = sum(e[3] for _, e in entry)
        calls = sum(e[1] for _, e in entry)
        wrapped = sum(
            v[4][key][3] for k, v in stats.items() if k[2] == key[2] and not ours(k) and key in v[4]
        )  # the super() call the override extends
        own[f"{_label(key[0])}:{key[2]}"] = {"calls": calls, "own_s": max(0.0, cum - wrapped)}
    return {"loop_s": meta["loop_s"], "loop_wall_s": meta["loop_wall_s"], "steps": meta["steps"],
            "final_checkpoint_s": save, "parts": parts,
            "callbacks_ours_s": cb_ours, "callbacks_theirs_s": cb_theirs, "ours": own}  # fmt: skip


def _label(path: str) -> str:
    """posttrainllm/... of a file's path (the last `posttrainllm` folder on it)."""
    parts = Path(path).parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("posttrainllm") :])


def profile_side(side, data, model_dir, root, steps, batch, length, precision, env, tag) -> dict:
    from common import run_cmd

    out = root / f"{tag}_{side}"
    prof = str(root / f"{tag}_{side}.prof")
    if side == "trl":
        rest = trl_argv(data, model_dir, out, steps, batch, length, precision)[3:]
    else:
        rest = ours_argv("flat", data, model_dir, out, steps, batch, length, precision)[1:]
    wall, _ = run_cmd([sys.executable, __file__, "--worker", side, prof, *rest], env=env, timeout=7200)
    r = analyse(prof)
    r["wall_s"] = wall
    return r


def tiny_model(root: Path, train: Path) -> str:
    """A 2-block llama of width 64, built from a config, with a 512-token byte-level BPE trained on the rows
    (posttrainllm's own tokenizer trainer): a model whose step is small enough to show a per-step cost of ours."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from posttrainllm.models import train_bpe_tokenizer

    rows = [json.loads(line) for line in train.read_text(encoding="utf-8").splitlines()]
    tok = train_bpe_tokenizer([r["prompt"] + r["completion"] for r in rows], 512)
    cfg = AutoConfig.for_model(
        "llama", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    out = root / "tiny"
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def per_step(r: dict) -> dict:
    """Seconds → ms per step; the loop's time without the final checkpoint."""
    n = max(1, r["steps"])
    once = r["parts"].get("once (set-up, finish)", 0.0)
    step = (r["loop_s"] - r["final_checkpoint_s"] - once) * 1000 / n
    parts = dict(r["parts"])
    parts["log/save/evaluate"] = parts.get("log/save/evaluate", 0.0) - r["final_checkpoint_s"]
    parts["final checkpoint"] = r["final_checkpoint_s"]
    per_step_ours = {k: v for k, v in r["ours"].items() if v["calls"] > 1}
    ours_total = sum(v["own_s"] for v in per_step_ours.values()) * 1000 / n
    return {
        "step_ms": step, "compute_ms": sum(v for k, v in r["parts"].items() if k in _COMPUTE_PARTS) * 1000 / n,
        "parts_ms": {k: v * 1000 / n for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
        "ours_once_ms": sum(v["own_s"] for k, v in r["ours"].items() if k not in per_step_ours) * 1000 / n,
        "callbacks_ours_ms": r["callbacks_ours_s"] * 1000 / n,
        "callbacks_theirs_ms": r["callbacks_theirs_s"] * 1000 / n,
        "loop_wall_s": r["loop_wall_s"], "ours_ms": ours_total, "final_checkpoint_s": r["final_checkpoint_s"],
        "steps": r["steps"],
        "ours_by_function_ms": {k: (v["calls"], v["own_s"] * 1000 / n) for k, v in
                                sorted(r["ours"].items(), key=lambda kv: -kv[1]["own_s"])},
    }  # fmt: skip


_COMPUTE_PARTS = ("forward+backward", "grad norm", "optimizer step", "zero_grad")


def measure(size, model_dir, data, root, a, env, steps, batch, length, precision, log, order_for, median) -> dict:
    res: dict[str, list] = {"posttrainllm": [], "trl": []}
    for rep in range(a.reps):
        for side in order_for(rep, ["posttrainllm", "trl"]):
            log(f"{size} {precision} rep {rep + 1}/{a.reps}: {side} ({steps} steps) ...")
            r = profile_side("trl" if side == "trl" else "ours", data, model_dir, root, steps, batch, length,
                             precision, env, f"{size}_{precision}_{rep}")  # fmt: skip
            res[side].append(per_step(r))
    ratio = median([t["step_ms"] / o["step_ms"] for o, t in zip(res["posttrainllm"], res["trl"])])
    return {"size": size, "precision": precision, "steps": steps, "batch": batch, "max_length": length,
            "raw": res, "speed_ratio_ours_over_trl": ratio}  # fmt: skip


def elementwise_check(model) -> bool:
    """The weight check before a checkpoint as it was until 2026-12-03 (an isfinite mask of every tensor, in
    chunks): the "before" of `weight_check_cost`."""
    import torch

    with torch.no_grad():
        flags = [torch.isfinite(c).all() for p in model.parameters() for c in p.detach().reshape(-1).split(1 << 24)]
        return bool(torch.stack(flags).all())


def weight_check_cost(model_dir: str, reps: int, order_for, median) -> dict:
    """CPU ms of the weight check that every checkpoint and the final save run (posttrainllm's
    `nonfinite_parameters`) against the element-wise check it replaced, on the real model, rotated."""
    import torch
    from transformers import AutoModelForCausalLM

    from posttrainllm.rundir.checkpoints import nonfinite_parameters

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    sides = {
        "before (element-wise)": lambda: elementwise_check(model),
        "now (sums first)": lambda: nonfinite_parameters(model),
    }
    times: dict[str, list[float]] = {k: [] for k in sides}
    for rep in range(max(3, reps)):
        for name in order_for(rep, list(sides)):
            c0 = time.process_time()
            sides[name]()
            times[name].append((time.process_time() - c0) * 1000)
    return {k: median(v) for k, v in times.items()}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4:])
        return

    from common import base_parser, emit, log, machine_info, median, order_for

    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", help="model directory (default: bench/smollm2.py's converted SmolLM2)")
    p.add_argument("--dataset", default=str(SHARED / "alpaca_en_demo.json"), help="Alpaca-format JSON")
    p.add_argument("--tiny-steps", type=int, default=30)
    p.add_argument("--real-steps", type=int, default=8)
    p.add_argument("--real-precisions", default="fp32,bf16")
    p.add_argument("--tiny-precision", default="fp32")
    p.add_argument("--skip-tiny", action="store_true")
    p.add_argument("--skip-real", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    a.reps = a.reps or 2
    model_dir, env = model_and_env(a.model, a.threads)
    machine = machine_info()
    runs = []
    check = None if a.skip_real else weight_check_cost(model_dir, a.reps, order_for, median)
    with tempfile.TemporaryDirectory(prefix="posttrainllm-profile-") as tmp:
        root = Path(tmp)
        data = write_data(root, Path(a.dataset))
        common = (data, root, a, env)
        if not a.skip_real:
            for prec in a.real_precisions.split(","):
                runs.append(measure("SmolLM2", model_dir, *common, a.real_steps, 4, 192, prec, log, order_for, median))
        if not a.skip_tiny:
            tiny = tiny_model(root, data["train"])
            runs.append(measure("tiny", tiny, *common, a.tiny_steps, 4, 192, a.tiny_precision, log, order_for, median))
    result = {"machine": machine, "argv": sys.argv[1:], "model": model_dir, "runs": runs, "weight_check_ms": check}
    emit(result, a.json, report(runs, machine, check))


def report(runs: list[dict], machine: dict, check: dict | None = None) -> str:
    real = {r["precision"]: median_step(r) for r in runs if r["size"] == "SmolLM2"}
    ref = real.get("fp32") or next(iter(real.values()), None)
    lines = [f"load at start {machine.get('loadavg_at_start')}; {machine['cpu']}; torch {machine['torch']}"]
    for r in runs:
        lines.append(
            f"{r['size']} {r['precision']}, {r['steps']} steps × batch {r['batch']} × {r['max_length']}: "
            f"posttrainllm/TRL speed (loop CPU time without the final checkpoint, median of per-rep ratios) "
            f"{r['speed_ratio_ours_over_trl']:.3f}; per rep "
            f"{[round(t['step_ms'] / o['step_ms'], 3) for o, t in zip(r['raw']['posttrainllm'], r['raw']['trl'])]}"
        )
        pct_ref = real.get(r["precision"], ref)

        def pct(ms: float, base=pct_ref) -> str:
            return f"{100 * ms / base:.3f}%" if base else "no SmolLM2 run"

        for side, reps in r["raw"].items():
            x = reps[0] if len(reps) == 1 else sorted(reps, key=lambda v: v["step_ms"])[len(reps) // 2]
            lines.append(
                f"  {side:12s} (median rep) CPU ms per step: step {x['step_ms']:9.2f}  (loop wall "
                f"{x['loop_wall_s']:.1f} s)  compute {x['compute_ms']:9.2f} ms  callbacks: ours "
                f"{x['callbacks_ours_ms']:.3f} ms, transformers/TRL {x['callbacks_theirs_ms']:.3f} ms "
                f"({pct(x['callbacks_theirs_ms'])})  posttrainllm's own code {x['ours_ms']:.3f} ms "
                f"({pct(x['ours_ms'])} of a SmolLM2 step)"
            )
            excluded = ("final checkpoint", "once (set-up, finish)")
            kept = [f"{k} {v:.2f}" for k, v in x["parts_ms"].items() if k not in excluded and v >= 0.005]
            lines.append("    ms/step: " + ", ".join(kept))
            once = x["parts_ms"].get("once (set-up, finish)", 0.0) * x["steps"] / 1000
            lines.append(
                f"    left out (once per run): final checkpoint {x['final_checkpoint_s']:.2f} s, set-up and "
                f"finish inside the loop {once:.2f} s, ours once {x['ours_once_ms'] * x['steps']:.1f} ms"
            )
            for name, (calls, ms) in list(x["ours_by_function_ms"].items())[:8]:
                lines.append(f"    ours {name:60s} {calls:5d} calls {ms:8.4f} ms/step ({pct(ms)})")
    if check:
        ref_text = (
            f" = {100 * max(check.values()) / ref:.2f}% / {100 * min(check.values()) / ref:.2f}% of a step"
            if ref
            else ""
        )
        lines.append(
            "weight check before each checkpoint and the final save (SmolLM2, fp32 weights, CPU ms, median): "
            + ", ".join(f"{k} {v:.1f}" for k, v in check.items())
            + ref_text
        )
    return "\n".join(lines)


def median_step(r: dict) -> float:
    steps = sorted(x["step_ms"] for x in r["raw"]["posttrainllm"] + r["raw"]["trl"])
    return steps[len(steps) // 2]


if __name__ == "__main__":
    main()
