"""Time of ``build_param_groups`` on Llama-3-70B-shaped models on the meta device (no memory), 10..80 blocks.

    python bench/group_build.py [--quick] [--json] [--blocks 10,20,40,80] [--no-profile] [--no-cap-check]

The models (hidden 8192, intermediate 28672, 64 heads, 8 KV heads, vocab 128256, untied) are instantiated once
each with ``torch.device("meta")``; then ``build_param_groups(model, 1e-5, gamma=0.9, weight_decay=0.01)`` is timed
``--reps`` times per size, the sizes rotated between repetitions; the figure is the median per size and the slope
(seconds per block, least squares). A cProfile of the largest size lists where the time goes.

Also checks the group cap: an 8-block model of several architectures (llama untied/tied, gpt2, qwen2 with biases,
opt, gpt_neox, and llama + LoRA when peft is installed) never gets more than 2·(8+2) = 20 groups with weight decay > 0.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import alternate, base_parser, emit, fmt_count, log, machine_info, median  # noqa: E402

L70B = dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8, vocab_size=128256)


def meta_llama(blocks: int):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(LlamaConfig(num_hidden_layers=blocks, **L70B))


def build(model):
    from posttrainllm.llrd import build_param_groups

    return build_param_groups(model, 1e-5, gamma=0.9, weight_decay=0.01)


def lsq(xs, ys):
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def cap_check(blocks: int = 8) -> list[dict]:
    """Groups of tiny 8-block models of several architectures with weight decay > 0 (must be ≤ 2·(N + 2))."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    small = dict(vocab_size=512)
    specs = {
        "llama (untied)": (
            "llama",
            dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=blocks,
                num_attention_heads=4,
                num_key_value_heads=2,
                tie_word_embeddings=False,
            ),
        ),
        "llama (tied)": (
            "llama",
            dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=blocks,
                num_attention_heads=4,
                num_key_value_heads=2,
                tie_word_embeddings=True,
            ),
        ),
        "qwen2 (qkv biases)": (
            "qwen2",
            dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=blocks,
                num_attention_heads=4,
                num_key_value_heads=2,
            ),
        ),
        "gpt2 (wte+wpe, biases)": (
            "gpt2",
            dict(n_embd=64, n_layer=blocks, n_head=4, n_positions=128, bos_token_id=0, eos_token_id=0),
        ),
        "opt (project_in/out)": (
            "opt",
            dict(
                hidden_size=64,
                word_embed_proj_dim=32,
                ffn_dim=128,
                num_hidden_layers=blocks,
                num_attention_heads=4,
                max_position_embeddings=128,
            ),
        ),
        "gpt_neox": (
            "gpt_neox",
            dict(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=blocks,
                num_attention_heads=4,
                max_position_embeddings=128,
            ),
        ),
    }
    rows = []
    for label, (mtype, kw) in specs.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(mtype, **small, **kw))
        for wd in (0.01, 0.1):
            plan = (
                build(model)
                if wd == 0.01
                else __import__("posttrainllm.llrd", fromlist=["x"]).build_param_groups(
                    model, 1e-5, gamma=0.9, weight_decay=wd
                )
            )
            rows.append(
                {
                    "model": label,
                    "weight_decay": wd,
                    "blocks": plan.num_layers,
                    "groups": len(plan.groups),
                    "cap": 2 * (plan.num_layers + 2),
                    "ok": len(plan.groups) <= 20 and plan.num_layers == blocks,
                }
            )
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        rows.append({"model": "llama + LoRA", "skipped": "peft not installed"})
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **small, **specs["llama (untied)"][1]))
        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
        plan = build(model)
        rows.append(
            {
                "model": "llama + LoRA (all-linear)",
                "weight_decay": 0.01,
                "blocks": plan.num_layers,
                "groups": len(plan.groups),
                "cap": 2 * (plan.num_layers + 2),
                "ok": len(plan.groups) <= 20,
            }
        )
    return rows


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--blocks", default="10,20,40,80")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--no-cap-check", action="store_true")
    a = p.parse_args()
    reps = a.reps or (5 if a.quick else 15)
    sizes = [int(b) for b in a.blocks.split(",")]
    result: dict = {"machine": machine_info(), "argv": sys.argv[1:], "reps": reps, "shape": L70B, "sizes": {}}
    lines = [f"build_param_groups on Llama-3-70B-shaped models (meta device), median of {reps} rotated repetitions"]

    models = {}
    for n in sizes:
        t0 = time.perf_counter()
        models[n] = meta_llama(n)
        log(f"instantiated {n} blocks on meta in {time.perf_counter() - t0:.2f} s")
        result["sizes"][str(n)] = {
            "instantiate_s": time.perf_counter() - t0,
            "params": sum(p.numel() for p in models[n].parameters()),
        }
    for n in sizes:  # warm-up (regex compilation, first-call imports)
        build(models[n])

    def timer(n):
        def run():
            t0 = time.perf_counter()
            build(models[n])
            return time.perf_counter() - t0

        return run

    res = alternate({str(n): timer(n) for n in sizes}, reps)
    ts = [median(res[str(n)]) for n in sizes]
    slope, icpt = lsq([float(n) for n in sizes], ts)
    for n, t in zip(sizes, ts):
        plan = build(models[n])
        result["sizes"][str(n)].update(
            build_s=t,
            build_min_s=min(res[str(n)]),
            groups=len(plan.groups),
            tensors=sum(len(g["params"]) for g in plan.groups),
        )
        lines.append(
            f"  {n:3d} blocks ({fmt_count(result['sizes'][str(n)]['params'])} "
            f"params, {result['sizes'][str(n)]['tensors']} tensors, "
            f"{len(plan.groups)} groups): {t * 1e3:8.1f} ms  (min {min(res[str(n)]) * 1e3:.1f}; instantiate on meta "
            f"{result['sizes'][str(n)]['instantiate_s']:.2f} s)"
        )
    result["seconds_per_block"] = slope
    result["intercept_s"] = icpt
    big = max(sizes)
    result["target_80_blocks_le_0_5_s"] = result["sizes"][str(big)]["build_s"] <= 0.5 if big == 80 else None
    lines.append(
        f"  slope {slope * 1e3:.2f} ms per block, intercept {icpt * 1e3:.1f} ms; {big} blocks: "
        f"{result['sizes'][str(big)]['build_s']:.3f} s (target ≤ 0.5 s for 80)"
    )

    if not a.no_profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3):
            build(models[big])
        prof.disable()
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s).sort_stats("tottime")
        st.print_stats(15)
        text = s.getvalue()
        keep = text[text.find("ncalls") :] if "ncalls" in text else text
        result["profile_top_tottime"] = keep
        lines.append(f"\ncProfile of 3 builds of the {big}-block model (sorted by own time):\n" + keep.rstrip())

    if not a.no_cap_check:
        rows = cap_check()
        result["group_cap_8_blocks"] = rows
        lines.append("\n8-block models, weight decay > 0: groups (cap 20)")
        for r in rows:
            lines.append(
                f"  {r['model']:26s} "
                + (
                    r["skipped"]
                    if "skipped" in r
                    else f"wd {r['weight_decay']:<5g} blocks {r['blocks']} groups "
                    f"{r['groups']:2d}  {'ok' if r['ok'] else 'OVER CAP'}"
                )
            )

    m = result["machine"]
    lines.append(
        f"\nmachine: {m['nproc']} CPUs ({m['cpu']}), torch {m['torch']}, load "
        f"at start {m.get('loadavg_at_start')}, {m['date']}"
    )
    emit(result, a.json, "\n".join(lines))


if __name__ == "__main__":
    main()
