"""bf16 vs fp32 on this CPU, side by side: matmul throughput and one training step of a model.

    python bench/cpu_precision.py                       # matmuls only (seconds)
    python bench/cpu_precision.py --model DIR_OR_GGUF   # plus forward+backward at batch 4 x 192 (minutes)

Prints whether the CPU has bf16 instructions (AVX512-BF16 / AMX, as torch reports them), GFLOPS of a
768x2048 @ 2048x2048 matmul in fp32 and bf16 (rotated, median of rounds) and their ratio, and with --model the
seconds of a forward+backward in fp32 and under bf16 autocast (the loss of both, to show they agree).
This decides `--precision auto` on CPU (docs/decision_log.md 37).
"""

from __future__ import annotations

import argparse
import statistics
import time


def matmul_gflops(dtype, rounds: int = 5, n: int = 10) -> list[float]:
    import torch

    a, b = torch.randn(768, 2048).to(dtype), torch.randn(2048, 2048).to(dtype)
    a @ b
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            a @ b
        out.append(2 * 768 * 2048 * 2048 * n / (time.perf_counter() - t) / 1e9)
    return out


def step_seconds(model, autocast: bool) -> tuple[float, float]:
    import torch

    torch.manual_seed(0)
    x = torch.randint(0, model.config.vocab_size, (4, 192))
    t = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t, float(loss)


def main() -> None:
    import torch

    from posttrainllm.models import cpu_has_native_bf16

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", help="a model directory or .gguf file for the training-step comparison")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"native bf16 (AVX512-BF16 or AMX): {cpu_has_native_bf16()}; torch {torch.__version__}, {args.threads} thr")
    # bf16 is slow where it is emulated: fewer repetitions for it
    fp32, bf16 = statistics.median(matmul_gflops(torch.float32)), statistics.median(matmul_gflops(torch.bfloat16, 3, 1))
    print(f"matmul 768x2048 @ 2048x2048: fp32 {fp32:.1f} GFLOPS, bf16 {bf16:.2f} GFLOPS, bf16/fp32 {bf16 / fp32:.3f}")
    if args.model:
        from posttrainllm import models

        path, _ = models.resolve_model(args.model)
        model = models.load_model(path, precision="fp32")
        for autocast in (False, True, False, True):
            s, loss = step_seconds(model, autocast)
            print(
                f"forward+backward, batch 4 x 192, {'bf16 autocast' if autocast else 'fp32'}: {s:.2f} s, "
                f"loss {loss:.4f}"
            )


if __name__ == "__main__":
    main()
