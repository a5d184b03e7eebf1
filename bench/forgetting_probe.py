"""The forgetting probe's size (evaluate/probe.py): what sampling N texts of the starting model costs, and how much
the probe's KL(start ‖ tuned) varies with the seed that draws them, for several N, on a real model.

    python bench/forgetting_probe.py --model BASE_DIR --tuned TUNED_DIR [--sizes 4,8,16,32] [--seeds 0,1,2]

For each N and seed: the texts drawn from BASE (probe.obtain's draw, one thread), the seconds it took, and the probe's
KL of TUNED against BASE. Prints one JSON object: per N the mean KL, its spread over the seeds (max/min and the
coefficient of variation) and the median sampling time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm.evaluate import probe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tuned", required=True)
    ap.add_argument("--sizes", default="4,8,16,32")
    ap.add_argument("--seeds", default="0,1,2")
    a = ap.parse_args()
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(a.model)
    base = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    tuned = AutoModelForCausalLM.from_pretrained(a.tuned, dtype=torch.float32).eval()
    out: dict = {"model": a.model, "tuned": a.tuned, "tokens_per_sample": probe.PROBE_TOKENS}
    for n in (int(x) for x in a.sizes.split(",")):
        kls, secs = [], []
        for seed in (int(x) for x in a.seeds.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                texts = probe.obtain(base, tok, Path(tmp), n=n, seed=seed, model_identity="bench")
                secs.append(time.perf_counter() - t0)
            kls.append(probe.measure(tuned, base, tok, texts)["kl"])
        mean = statistics.mean(kls)
        out[n] = {
            "kl": kls,
            "mean": mean,
            "max/min": max(kls) / min(kls),
            "cv": statistics.pstdev(kls) / mean,
            "sampling_s_median": statistics.median(secs),
        }
        print(json.dumps({n: out[n]}), flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
