"""optimizer.step() time: LLRD param groups (≈ 2 per depth) vs the flat 2-group HF AdamW, same model, same grads.

    python bench/optimizer_step.py [--quick] [--json] [--hidden 512] [--blocks 12,24] [--impls fused,foreach]

Per model (llama-shaped, random init, fp32, CPU unless CUDA is there) and per AdamW implementation
(``fused=True``, ``foreach=True``, ``default`` = what ``--optim adamw_torch`` gets, i.e. torch's choice):
two optimizers over the same parameters, flat and LLRD, stepped in rounds (one step of each per round, the order
alternating between rounds; ``--reps`` × ``--steps`` rounds); the per-round ratio LLRD/flat, median over rounds,
is the figure (neighbouring steps are compared, so the drift of a shared machine mostly cancels).

Then the per-group cost: the same tensors cut into k = 1 .. n_tensors groups (contiguous chunks), timed side by
side on a model with the same number of tensors but tiny ones (so the fixed per-group cost is not buried under
the memory traffic), least squares of step time vs k → µs per group per step.

Then a prototype: one param group, per-tensor LR multipliers and weight decays, the multi-tensor AdamW update
written with ``torch._foreach_*`` ops taking per-tensor scalar lists (torch's own foreach AdamW already takes a
per-tensor step-size list, so this is the same arithmetic). Checked exact against grouped foreach AdamW
(parameters after N steps, bitwise and max |Δ|) and timed against it. A report only: the package is unchanged.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import alternate, base_parser, emit, fmt_count, llama_config, log, machine_info, median, ratios, spread  # noqa: E402

GAMMA, LR, WD = 0.9, 1e-4, 0.01


# ------------------------------------------------------------------------------------------------- groups
def flat_groups(model, wd: float = WD) -> list[dict]:
    """transformers' Trainer.create_optimizer grouping: decay / no-decay."""
    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in named if n in decay], "weight_decay": wd},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]


def llrd_groups(model, gamma: float = GAMMA, wd: float = WD) -> list[dict]:
    from posttrainllm.llrd import build_param_groups

    return build_param_groups(model, LR, gamma=gamma, weight_decay=wd).groups


def copy_groups(groups: list[dict]) -> list[dict]:
    """Fresh dicts (an optimizer writes its defaults into the group dicts it is given)."""
    return [dict(g, params=list(g["params"])) for g in groups]


def chunk_groups(params: list, k: int) -> list[dict]:
    """The tensors cut into k contiguous groups (all decayed: per-group cost only)."""
    n = len(params)
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [{"params": params[a:b], "weight_decay": WD} for a, b in zip(bounds, bounds[1:]) if b > a]


def make_adamw(groups: list[dict], impl: str):
    import torch

    kw = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {}}[impl]
    return torch.optim.AdamW(copy_groups(groups), lr=LR, **kw)


DEVICE, DTYPE = "cpu", "fp32"  # set from --device / --dtype


def build_model(hidden: int, blocks: int, vocab: int, seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(llama_config(hidden, blocks, vocab=vocab))
    model.to(device=DEVICE, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[DTYPE])
    for p in model.parameters():
        p.grad = torch.randn_like(p).mul_(1e-3)  # filled once; the step does not care about their values
    return model


def stepper(opt, steps: int):
    import time

    import torch

    sync = torch.cuda.synchronize if DEVICE.startswith("cuda") else (lambda: None)

    def run() -> float:  # median step time of this repetition (robust to a descheduled step)
        times = []
        for _ in range(steps):
            sync()
            t0 = time.perf_counter()
            opt.step()
            sync()
            times.append(time.perf_counter() - t0)
        return median(times)

    return run


# ------------------------------------------------------------------------------------------------- prototype
class ScaledAdamW:
    """AdamW over ONE list of tensors with a per-tensor LR multiplier and weight decay (prototype).

    Same arithmetic as torch's ``_multi_tensor_adam`` (foreach, capturable=False, decoupled decay): the per-tensor
    LR enters through the step-size list that torch already builds per tensor, and through a per-tensor list of
    decay factors ``1 - lr_i·wd_i``. Optional ``chunk``: process the tensors in chunks (like torch's grouping by
    device/dtype) — not needed on CPU.
    """

    def __init__(self, groups: list[dict], lr: float = LR, betas=(0.9, 0.999), eps: float = 1e-8):
        import torch

        self.params, self.scale, self.wd = [], [], []
        for g in groups:
            s = g.get("scale", g.get("lr", lr) / lr)
            for p in g["params"]:
                self.params.append(p)
                self.scale.append(s)
                self.wd.append(g.get("weight_decay", 0.0))
        self.lr, self.betas, self.eps = lr, betas, eps
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.step_count = 0

    def step(self) -> None:
        import torch

        with torch.no_grad():
            beta1, beta2 = self.betas
            self.step_count += 1
            t = float(self.step_count)
            params = self.params
            grads = [p.grad for p in params]
            lrs = [self.lr * s for s in self.scale]  # = the grouped version's base_lr·scale (same product)
            decay = [(i, 1 - lr_i * wd) for i, (lr_i, wd) in enumerate(zip(lrs, self.wd)) if wd != 0]
            if decay:
                torch._foreach_mul_([params[i] for i, _ in decay], [f for _, f in decay])
            torch._foreach_lerp_(self.exp_avg, grads, 1 - beta1)
            torch._foreach_mul_(self.exp_avg_sq, beta2)
            torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, 1 - beta2)
            bc1 = 1 - beta1**t
            bc2_sqrt = (1 - beta2**t) ** 0.5
            step_size = [(lr_i / bc1) * -1 for lr_i in lrs]
            denom = torch._foreach_sqrt(self.exp_avg_sq)
            torch._foreach_div_(denom, bc2_sqrt)
            torch._foreach_add_(denom, self.eps)
            torch._foreach_addcdiv_(params, self.exp_avg, denom, step_size)


def exactness(n_steps: int, hidden: int = 128, blocks: int = 8) -> dict:
    """Grouped foreach AdamW vs ScaledAdamW (and grouped fused) on two identical models, same grads each step."""
    import torch

    models = [build_model(hidden, blocks, 1000, seed=1) for _ in range(3)]
    opts = [
        make_adamw(llrd_groups(models[0]), "foreach"),
        ScaledAdamW(llrd_groups(models[1])),
        make_adamw(llrd_groups(models[2]), "fused"),
    ]
    gen = torch.Generator().manual_seed(123)
    plist = [list(m.parameters()) for m in models]
    for _ in range(n_steps):
        for i in range(len(plist[0])):
            g = torch.randn(plist[0][i].shape, generator=gen).to(plist[0][i])
            for ps in plist:
                ps[i].grad = g.clone()
        for o in opts:
            o.step()

    def diff(a, b):
        return max((x - y).abs().max().item() for x, y in zip(a, b))

    def rel(a, b):
        return max(((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item() for x, y in zip(a, b))

    moved = max(
        (p - q).abs().max().item()
        for p, q in zip(plist[0], list(build_model(hidden, blocks, 1000, seed=1).parameters()))
    )
    return {
        "steps": n_steps,
        "model": f"llama hidden {hidden}, {blocks} blocks",
        "n_groups_grouped": len(opts[0].param_groups),
        "max_param_change_from_init": moved,
        "prototype_vs_grouped_foreach_bitwise_equal": all(torch.equal(a, b) for a, b in zip(plist[0], plist[1])),
        "prototype_vs_grouped_foreach_max_abs_diff": diff(plist[1], plist[0]),
        "prototype_vs_grouped_foreach_max_rel_diff": rel(plist[1], plist[0]),
        "grouped_fused_vs_grouped_foreach_max_abs_diff": diff(plist[2], plist[0]),
    }


# ------------------------------------------------------------------------------------------------- main
def lsq_slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--blocks", default="12,24", help="comma-separated block counts")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--impls", default="fused,foreach", help="comma-separated: fused, foreach, default")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per repetition (default: per impl)")
    p.add_argument("--no-overhead", action="store_true", help="skip the per-group cost sweep")
    p.add_argument("--no-prototype", action="store_true", help="skip the single-group prototype")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="parameter / grad / state dtype")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (default 1: on a shared 2-core machine a 2-thread OpenMP step waits at "
        "barriers for descheduled threads, 10-100x outliers; 0 = torch's choice)",
    )
    a = p.parse_args()

    import torch

    global DEVICE, DTYPE
    DEVICE, DTYPE = a.device, a.dtype
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    reps = a.reps or (3 if a.quick else 7)
    default_steps = {"fused": 3 if a.quick else 6, "foreach": 1 if a.quick else 2, "default": 1 if a.quick else 2}
    if DEVICE != "cpu":
        default_steps = {k: 10 if a.quick else 30 for k in default_steps}
    result: dict = {
        "machine": machine_info(),
        "argv": sys.argv[1:],
        "device": DEVICE,
        "dtype": DTYPE,
        "reps": reps,
        "gamma": GAMMA,
        "lr": LR,
        "weight_decay": WD,
        "models": [],
    }
    lines = [
        f"optimizer.step() on {DEVICE} ({DTYPE}, {torch.get_num_threads()} CPU "
        f"threads): LLRD (γ={GAMMA}, wd={WD}) / flat HF 2-group AdamW — "
        f"median over rounds (one step of each contender per round, order rotated; {reps} × steps-per-impl rounds)"
    ]

    for blocks in [int(b) for b in a.blocks.split(",")]:
        log(f"building llama hidden {a.hidden}, {blocks} blocks ...")
        model = build_model(a.hidden, blocks, a.vocab)
        params = list(model.parameters())
        n_params = sum(p.numel() for p in params)
        fg, lg = flat_groups(model), llrd_groups(model)
        entry = {
            "hidden": a.hidden,
            "blocks": blocks,
            "vocab": a.vocab,
            "params": n_params,
            "tensors": len(params),
            "flat_groups": len(fg),
            "llrd_groups": len(lg),
            "impls": {},
        }
        lines.append(
            f"\nllama hidden {a.hidden}, {blocks} blocks, vocab {a.vocab}: {fmt_count(n_params)} params, "
            f"{len(params)} tensors; flat {len(fg)} groups, LLRD {len(lg)} groups"
        )
        for impl in a.impls.split(","):
            steps = a.steps or default_steps[impl]
            opt_flat, opt_llrd = make_adamw(fg, impl), make_adamw(lg, impl)
            opt_flat.step(), opt_llrd.step()  # state allocation outside the timing
            rounds = reps * steps  # one step of each per round, order rotated: neighbours in time are compared
            log(f"  {impl}: {rounds} rounds ...")
            res = alternate({"flat": stepper(opt_flat, 1), "llrd": stepper(opt_llrd, 1)}, rounds)
            r = ratios(res, "llrd", "flat")
            entry["impls"][impl] = {
                "rounds": rounds,
                "flat_step_s": median(res["flat"]),
                "llrd_step_s": median(res["llrd"]),
                "ratio_llrd_over_flat": median(r),
                "ratio_min_max": spread(r),
                "raw": res,
            }
            lines.append(
                f"  {impl:8s} flat {median(res['flat']) * 1e3:8.1f} ms/step   LLRD "
                f"{median(res['llrd']) * 1e3:8.1f} ms/step"
                f"   ratio {median(r):.3f} (min {min(r):.3f}, max {max(r):.3f})"
            )
            del opt_flat, opt_llrd
            gc.collect()
        result["models"].append(entry)
        del model, params, fg, lg
        gc.collect()

    big = result["models"][-1]
    if not a.no_overhead:
        # Same tensor count as the largest model above, tiny tensors: the step is then mostly fixed costs.
        small = build_model(64, big["blocks"], 512)
        sp = list(small.parameters())
        ks = sorted({1, 2, 4, 8, big["llrd_groups"], 2 * big["llrd_groups"], len(sp)})
        over = {
            "model": f"llama hidden 64, {big['blocks']} blocks, vocab 512 ({len(sp)} "
            f"tensors, {fmt_count(sum(p.numel() for p in sp))} params)",
            "k": ks,
            "impls": {},
        }
        lines.append(f"\nper-group cost: {over['model']} cut into k groups")
        for impl in a.impls.split(","):
            opts = {k: make_adamw(chunk_groups(sp, k), impl) for k in ks}
            for o in opts.values():
                o.step()
            n = 20 if a.quick else 50
            res = alternate({str(k): stepper(o, n) for k, o in opts.items()}, reps)
            ys = [median(res[str(k)]) for k in ks]
            slope, icpt = lsq_slope([float(k) for k in ks], ys)
            extra = big["llrd_groups"] - big["flat_groups"]
            flat_t = big["impls"][impl]["flat_step_s"]
            over["impls"][impl] = {
                "step_s_by_k": dict(zip(map(str, ks), ys)),
                "us_per_group": slope * 1e6,
                "intercept_s": icpt,
                "implied_llrd_extra_s": slope * extra,
                "implied_llrd_overhead_fraction": slope * extra / flat_t,
            }
            lines.append(f"  {impl:8s} " + "  ".join(f"k={k}: {y * 1e3:.2f} ms" for k, y in zip(ks, ys)))
            lines.append(
                f"           → {slope * 1e6:.1f} µs per group per step; LLRD's {extra} extra groups on the "
                f"{big['blocks']}-block model: {slope * extra * 1e3:.2f} ms = "
                f"{100 * slope * extra / flat_t:.2f}% of its flat step"
            )
            del opts
            gc.collect()
        result["per_group_cost"] = over
        del small, sp

    if not a.no_prototype:
        log("prototype: exactness ...")
        ex = exactness(10 if a.quick else 30)
        result["prototype_exactness"] = ex
        lines.append(
            f"\nsingle-group prototype (per-tensor LR multipliers, torch._foreach_* with scalar lists), "
            f"{ex['steps']} steps on {ex['model']} vs grouped foreach AdamW ({ex['n_groups_grouped']} groups): "
            f"bitwise equal {ex['prototype_vs_grouped_foreach_bitwise_equal']}, max |Δ| "
            f"{ex['prototype_vs_grouped_foreach_max_abs_diff']:.3g} (params moved "
            f"up to {ex['max_param_change_from_init']:.3g}); "
            f"grouped fused vs grouped foreach max |Δ| {ex['grouped_fused_vs_grouped_foreach_max_abs_diff']:.3g}"
        )
        log("prototype: timing ...")
        model = build_model(a.hidden, big["blocks"], a.vocab)
        fg, lg = flat_groups(model), llrd_groups(model)
        opts = {
            "flat_foreach": make_adamw(fg, "foreach"),
            "llrd_foreach": make_adamw(lg, "foreach"),
            "single_group_proto": ScaledAdamW(lg),
        }
        for o in opts.values():
            o.step()
        steps = a.steps or default_steps["foreach"]
        res = alternate({k: stepper(o, 1) for k, o in opts.items()}, reps * steps)
        r1, r2 = ratios(res, "single_group_proto", "llrd_foreach"), ratios(res, "single_group_proto", "flat_foreach")
        result["prototype_timing"] = {
            "model": f"hidden {a.hidden}, {big['blocks']} blocks",
            "step_s": {k: median(v) for k, v in res.items()},
            "ratio_proto_over_llrd_foreach": median(r1),
            "ratio_proto_over_flat_foreach": median(r2),
            "raw": res,
        }
        lines.append(
            f"  timing on the {big['blocks']}-block model: "
            + ", ".join(f"{k} {median(v) * 1e3:.1f} ms" for k, v in res.items())
            + f"; proto/LLRD-foreach {median(r1):.3f}, proto/flat-foreach {median(r2):.3f}"
        )
        del opts, model

    m = result["machine"]
    lines.append(
        f"\nmachine: {m['nproc']} CPUs ({m['cpu']}), torch {m['torch']} ({m['torch_threads']} threads), "
        f"load at start {m.get('loadavg_at_start')}, {m['date']}"
    )
    emit(result, a.json, "\n".join(lines))


if __name__ == "__main__":
    main()
