"""The distributed engines that need GPUs, checked on one machine: FSDP1 and DeepSpeed ZeRO-2/3 with layer decay.

Run through bench/gpu_distributed.sh. Each case launches `posttrainllm sft --llrd 0.8` on a 4-block llama built here
(random init, nothing downloaded) with `accelerate launch --config_file examples/accelerate/<case>.yaml`, through a
small wrapper that records, on every rank, the groups the prepared optimizer really holds, then checks:

| case | expected |
|---|---|
| fsdp2 | trains; groups read back == param_groups.json (names, LRs, weight decay, parameter names); drift ∝ γ^depth |
| fsdp1_orig_params | FSDP1 with fsdp_use_orig_params: true: the same checks |
| fsdp1_flat_params | FSDP1 with fsdp_use_orig_params: false: refused ("use_orig_params"), nothing trained |
| deepspeed_zero2, _zero3 | no "optimizer" block: trains; our group names, LRs, weight decay and sizes read back |
|  | from DeepSpeed's optimizer (element counts summed over ranks); drift ∝ γ^depth |
| deepspeed_own_optimizer | a DeepSpeed config with its own "optimizer": refused, nothing trained |
| ddp | the reference: `torchrun`, same seed; every engine's final model is compared with it (reported) |

`--cpu` runs the subset that works without GPUs (fsdp2 with examples/accelerate/fsdp2_cpu.yaml, ddp), to check this
script itself. Writes OUT/summary.json and OUT/summary.txt; exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "examples" / "accelerate"
GAMMA = 0.8
ARGS = [
    "--llrd",
    str(GAMMA),
    "--lr",
    "1e-3",
    "--max-steps",
    "12",
    "--save-steps",
    "6",
    "--batch-size",
    "2",
    "--max-length",
    "128",
    "--logging-steps",
    "1",
    "--weight-decay",
    "0.1",
    "--precision",
    "fp32",
]
CASE_TIMEOUT_S = 150

SPY = textwrap.dedent("""
    import json, os, sys
    import transformers
    from posttrainllm import cli
    from posttrainllm.llrd import strip_wrappers

    original = transformers.Trainer._prepare_for_training

    def prepare(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        import torch
        import torch.distributed as dist
        name_of = {id(p): strip_wrappers(n) for n, p in self.model.named_parameters()}
        groups = self.optimizer.param_groups  # accelerate's wrapper -> torch's / DeepSpeed's optimizer groups
        numel = torch.tensor([float(sum(p.numel() for p in g["params"])) for g in groups], device=self.args.device)
        if dist.is_initialized() and self.is_deepspeed_enabled:  # ZeRO: each rank holds a slice of each group
            dist.all_reduce(numel)
        engine = "deepspeed" if self.is_deepspeed_enabled else "fsdp" if self.is_fsdp_enabled else "ddp"
        rows = [{"name": g.get("name"), "lr": g["lr"], "weight_decay": g["weight_decay"],
                 "params": [name_of.get(id(p)) for p in g["params"]], "numel": int(n)}
                for g, n in zip(groups, numel.tolist())]
        dump = {"engine": engine, "groups": rows}
        with open(os.path.join(os.environ["SPY_DIR"], f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump(dump, f)
        return out

    transformers.Trainer._prepare_for_training = prepare
    sys.argv = ["posttrainllm", *sys.argv[1:]]
    cli.main()
""")


def prepare(root: Path) -> tuple[Path, Path]:
    """A 4-block llama (random init) with a BPE tokenizer trained here, and 64 Alpaca-shaped rows."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from posttrainllm.models import train_bpe_tokenizer

    model_dir, data = root / "model", root / "alpaca.json"
    rows = [
        {"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"The sum is {2 * i + 1}."} for i in range(64)
    ]
    data.write_text(json.dumps(rows))
    corpus = [
        "the quick brown fox jumps over the lazy dog. " * 3,
        "def add(a, b):\n    return a + b\n",
        "Instruction: add two numbers. Response: the sum is 42.",
        "hello world, this is a tiny corpus for a tiny tokenizer.",
    ]
    tok = train_bpe_tokenizer(corpus * 20, 320)
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "llama",
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    )
    AutoModelForCausalLM.from_config(cfg).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    (root / "spy.py").write_text(SPY)
    return model_dir, data


def write_config(root: Path, name: str, base: str, edits: dict[str, str], ds_json: dict | None = None) -> Path:
    """A copy of examples/accelerate/<base>.yaml with `key: value` lines replaced (or a DeepSpeed JSON file named)."""
    lines = (CONFIGS / f"{base}.yaml").read_text().splitlines()
    out = []
    for line in lines:
        key = line.strip().split(":")[0]
        out.append(line.split(key)[0] + f"{key}: {edits.pop(key)}" if key in edits and ":" in line else line)
    if ds_json is not None:
        (root / f"{name}.json").write_text(json.dumps(ds_json, indent=2))
        out = [ln for ln in out if not ln.startswith("  ") or ln.strip().startswith("#")]
        out = [ln for ln in out if ln.strip() != "deepspeed_config:"] + [
            "deepspeed_config:",
            f"  deepspeed_config_file: {root / f'{name}.json'}",
        ]
    path = root / f"{name}.yaml"
    path.write_text("\n".join(out) + "\n")
    return path


def launch(root: Path, name: str, config: Path | None, model: Path, data: Path, nproc: int, port: int) -> dict:
    spy = root / name / "spy"
    spy.mkdir(parents=True)
    out = root / name / "out"
    env = {**os.environ, "SPY_DIR": str(spy), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if config is None:
        head = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_port",
            str(port),
        ]
    else:
        head = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(config),
            "--num_processes",
            str(nproc),
            "--main_process_port",
            str(port),
        ]
    cmd = head + [
        str(root / "spy.py"),
        "sft",
        "--model",
        str(model),
        "--dataset",
        str(data),
        "--output-dir",
        str(out),
        *ARGS,
    ]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=CASE_TIMEOUT_S, check=False)
        code, text = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        code, text = "timeout", f"{e.stdout or ''}{e.stderr or ''}"
    (root / name / "log.txt").write_text(text if isinstance(text, str) else text.decode(errors="replace"))
    ranks = {p.stem: json.loads(p.read_text()) for p in sorted(spy.glob("rank*.json"))}
    return {
        "name": name,
        "exit": code,
        "seconds": round(time.time() - t0, 1),
        "out": out,
        "ranks": ranks,
        "log": text[-4000:],
    }


def drift_ratios(out: Path) -> dict[str, float]:
    d = {r["block"]: r["drift"] for r in json.loads((out / "drift.json").read_text())["depths"]}
    return {f"block_{i}/block_3": d[f"block_{i}"] / d["block_3"] for i in range(3)}


def check_trained(result: dict, deepspeed: bool) -> list[str]:
    problems = []
    out = result["out"]
    if result["exit"] != 0:
        return [f"exit {result['exit']}"]
    planned = json.loads((out / "param_groups.json").read_text())
    if not result["ranks"]:
        problems.append("no rank recorded its optimizer")
    for rank, dump in result["ranks"].items():
        got = [(g["name"], g["lr"], g["weight_decay"]) for g in dump["groups"]]
        want = [(g["name"], g["lr"], g["weight_decay"]) for g in planned]
        if got != want:
            problems.append(f"{rank}: optimizer groups {got} != param_groups.json {want}")
        if deepspeed:  # ZeRO flattens (and pads) each group: compare element counts
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(out))
            sizes = dict(model.named_parameters())
            for g, p in zip(dump["groups"], planned):
                want_n = sum(sizes[n].numel() for n in p["params"] if n in sizes)
                if not want_n <= g["numel"] <= want_n + 4096:
                    problems.append(f"{rank}: group {g['name']} holds {g['numel']} elements, planned {want_n}")
        else:
            from posttrainllm.llrd import strip_wrappers

            for g, p in zip(dump["groups"], planned):
                if g["params"] != [strip_wrappers(n) for n in p["params"]]:
                    problems.append(f"{rank}: group {g['name']} holds other parameters than planned")
    for key, ratio in drift_ratios(out).items():
        i = int(key.split("_")[1].split("/")[0])
        if abs(ratio / GAMMA ** (3 - i) - 1) > 0.2:
            problems.append(f"drift {key} = {ratio:.3f}, layer decay implies {GAMMA ** (3 - i):.3f}")
    return problems


def check_refused(result: dict, fragment: str) -> list[str]:
    problems = []
    if result["exit"] == 0:
        problems.append("trained instead of refusing")
    if fragment not in result["log"]:
        problems.append(f"no message containing {fragment!r}")
    if (result["out"] / "model.safetensors").exists():
        problems.append("wrote a model")
    return problems


def max_weight_difference(a: Path, b: Path) -> float | None:
    try:
        from transformers import AutoModelForCausalLM

        sa = AutoModelForCausalLM.from_pretrained(str(a)).state_dict()
        sb = AutoModelForCausalLM.from_pretrained(str(b)).state_dict()
        return max(float((t.float() - sb[k].float()).abs().max()) for k, t in sa.items())
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return f"not comparable: {type(e).__name__}: {e}"  # type: ignore[return-value]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", help="only the cases that run without GPUs (to check this script)")
    a = ap.parse_args()
    root = a.out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    model, data = prepare(root)
    try:
        import deepspeed  # noqa: F401

        has_ds = True
    except Exception:  # noqa: BLE001
        has_ds = False
    cases = [
        ("ddp", None, ("trained", False)),
        ("fsdp2", write_config(root, "fsdp2", "fsdp2_cpu" if a.cpu else "fsdp2", {}), ("trained", False)),
    ]
    if not a.cpu:
        cases += [
            ("fsdp1_orig_params", write_config(root, "fsdp1_orig", "fsdp1", {}), ("trained", False)),
            (
                "fsdp1_flat_params",
                write_config(root, "fsdp1_flat", "fsdp1", {"fsdp_use_orig_params": "false"}),
                ("refused", "use_orig_params"),
            ),
        ]
        if has_ds:
            own = {
                "zero_optimization": {"stage": 2},
                "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
            }
            cases += [
                ("deepspeed_zero2", write_config(root, "ds2", "deepspeed_zero2", {}), ("trained", True)),
                ("deepspeed_zero3", write_config(root, "ds3", "deepspeed_zero3", {}), ("trained", True)),
                (
                    "deepspeed_own_optimizer",
                    write_config(root, "ds_own", "deepspeed_zero2", {}, ds_json=own),
                    ("refused", 'its own "optimizer"'),
                ),
            ]
    summary = {"nproc": a.nproc, "gamma": GAMMA, "args": ARGS, "deepspeed_installed": has_ds, "cases": {}}
    if not has_ds and not a.cpu:
        summary["cases"]["deepspeed_*"] = {
            "status": "SKIPPED",
            "why": "deepspeed is not installed (pip install deepspeed)",
        }
    failed = False
    ddp_out = None
    for i, (name, config, expect) in enumerate(cases):
        result = launch(root, name, config, model, data, a.nproc, 29700 + i)
        if expect[0] == "trained":
            problems = check_trained(result, deepspeed=expect[1])
        else:
            problems = check_refused(result, expect[1])
        row = {
            "status": "FAIL" if problems else "ok",
            "exit": result["exit"],
            "seconds": result["seconds"],
            "problems": problems,
        }
        if result["exit"] == 0 and (result["out"] / "drift.json").exists():
            row["drift_ratios"] = {k: round(v, 4) for k, v in drift_ratios(result["out"]).items()}
        if name == "ddp" and result["exit"] == 0:
            ddp_out = result["out"]
        elif ddp_out is not None and result["exit"] == 0:
            row["max_weight_difference_vs_ddp"] = max_weight_difference(result["out"], ddp_out)
        if problems:
            row["log_tail"] = result["log"][-1500:]
        failed |= bool(problems)
        summary["cases"][name] = row
        print(
            f"{name:24s} {row['status']:5s} exit={result['exit']} {result['seconds']:6.1f}s  "
            + "; ".join(problems or [json.dumps(row.get("drift_ratios", {}))]),
            flush=True,
        )
    (root / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    lines = [
        f"{n}: {r['status']}" + (f" ({r.get('why')})" if r.get("why") else "") for n, r in summary["cases"].items()
    ]
    (root / "summary.txt").write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
