"""--self-replay's sampling against a bare `model.generate` loop at the same settings, side by side in one process.

    OMP_NUM_THREADS=1 nice python bench/self_replay.py           # SmolLM2-135M: N=16 × 4 reps, then N=32 at 192
    python bench/self_replay.py --model DIR --full-n 0 --json    # another model, no long run

Both contenders draw N samples at temperature 1 (no top-k / top-p), at most --max-length tokens with the prompt, in
batches of --batch-size, seeded with --seed: posttrainllm's `data.self_replay.draw` and a plain loop of
`torch.manual_seed(seed)` + `model.generate` + `batch_decode`. They must give the same texts (checked). Reported:
samples/s and generated tokens/s of each, the median per-repetition ratio in wall and in process CPU time (goal
≥ 0.9), and, with --full-n, the time posttrainllm takes for that many samples at --full-max-length (plus the model
load a run adds for sampling). The prompt is BOS (what sft on prompt/completion strings and finetune use); --chat
takes the empty user turn of the chat template.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import alternate, base_parser, emit, log, machine_info, median, ratios, spread  # noqa: E402


def _default_model() -> str:
    from smollm2 import gguf_file

    from posttrainllm.models import gguf

    path = gguf_file(gguf.cache_root().parent)
    return str(gguf.convert(path, gguf.inspect(path)))


def bare_loop(model, tok, prompt: list[int], *, n: int, max_length: int, seed: int, batch_size: int) -> list[str]:
    """What a user would write: seed, then model.generate batch after batch, then batch_decode."""
    import torch

    torch.manual_seed(seed)
    texts: list[str] = []
    with torch.inference_mode():
        while len(texts) < n:
            b = min(batch_size, n - len(texts))
            ids = torch.tensor([prompt] * b)
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=max_length - len(prompt), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            )  # fmt: skip
            texts += tok.batch_decode(out[:, len(prompt) :], skip_special_tokens=True)
    return texts


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model directory (default: the converted SmolLM2-135M-Instruct)")
    p.add_argument("--n", type=int, default=16, help="samples per repetition of the side-by-side comparison")
    p.add_argument("--full-n", type=int, default=32, help="then time posttrainllm alone for this many (0: skip)")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--full-max-length", type=int, default=192, help="--max-length of the --full-n run")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--chat", action="store_true", help="prompt: the chat template's empty user turn (default BOS)")
    args = p.parse_args()
    reps = args.reps or (1 if args.quick else 4)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm.data import self_replay as SR

    torch.set_num_threads(args.threads)
    model_dir = args.model or _default_model()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    prompt = SR.prompt_ids(tok, chat=args.chat)
    settings = dict(n=args.n, max_length=args.max_length, seed=args.seed, batch_size=args.batch_size)
    got: dict[str, list] = {}

    cpu: dict[str, list[float]] = {"posttrainllm": [], "bare generate": []}

    def ours() -> float:
        t, c = time.perf_counter(), time.process_time()
        texts, lengths = SR.draw(model, tok, prompt, **settings)
        got["ours"], got["tokens"] = texts, sum(lengths)
        cpu["posttrainllm"].append(time.process_time() - c)
        return time.perf_counter() - t

    def bare() -> float:
        t, c = time.perf_counter(), time.process_time()
        got["bare"] = bare_loop(model, tok, prompt, **settings)
        cpu["bare generate"].append(time.process_time() - c)
        return time.perf_counter() - t

    log(f"{args.n} samples × {reps} repetitions per contender, max length {args.max_length}, batch {args.batch_size}")
    times = alternate({"posttrainllm": ours, "bare generate": bare}, reps)
    identical = got["ours"] == got["bare"]
    per_s = {k: [args.n / t for t in v] for k, v in times.items()}
    ratio = [1 / r for r in ratios(times, "posttrainllm", "bare generate")]  # samples/s ratio = inverse time ratio
    cpu_ratio = [1 / r for r in ratios(cpu, "posttrainllm", "bare generate")]  # the same in CPU time (load-proof)
    result = {
        "machine": machine_info(),
        "model": model_dir,
        "prompt": "chat" if args.chat else "bos",
        "prompt_tokens": len(prompt),
        **settings,
        "threads": args.threads,
        "reps": reps,
        "seconds": times,
        "samples_per_s": {k: median(v) for k, v in per_s.items()},
        "generated_tokens_per_rep": got["tokens"],
        "ratio_samples_per_s": median(ratio),
        "ratio_spread": spread(ratio),
        "cpu_seconds": cpu,
        "ratio_cpu_time": median(cpu_ratio),
        "ratio_cpu_time_spread": spread(cpu_ratio),
        "identical_texts": identical,
        "model_load_s": round(load_s, 2),
    }
    lines = [
        f"model {Path(model_dir).name}, prompt {result['prompt']} ({len(prompt)} tokens), N={args.n}, max length "
        f"{args.max_length}, batch {args.batch_size}, {args.threads} thread(s), {reps} rep(s)",
        *(
            f"  {k:14s} {median(v):7.3f} samples/s  ({got['tokens'] / median(times[k]):.1f} generated tokens/s)"
            for k, v in per_s.items()
        ),  # fmt: skip
        f"  ratio posttrainllm / bare generate: {median(ratio):.3f} samples/s (spread {spread(ratio)[0]:.3f}-"
        f"{spread(ratio)[1]:.3f}); identical texts: {identical}",
        f"  the same in process CPU time: {median(cpu_ratio):.3f} (spread {spread(cpu_ratio)[0]:.3f}-"
        f"{spread(cpu_ratio)[1]:.3f})",
    ]
    if args.full_n:
        log(f"posttrainllm alone: {args.full_n} samples")
        full_length = args.full_max_length
        t, c = time.perf_counter(), time.process_time()
        texts, lengths = SR.draw(model, tok, prompt, **{**settings, "n": args.full_n, "max_length": full_length})
        full, full_cpu = time.perf_counter() - t, time.process_time() - c
        result["full"] = {"n": args.full_n, "max_length": full_length, "seconds": round(full, 1),
                          "cpu_seconds": round(full_cpu, 1), "generated_tokens": sum(lengths),
                          "samples_per_s": round(args.full_n / full, 3)}  # fmt: skip
        lines.append(
            f"  N={args.full_n} at max length {full_length}: {full:.0f} s sampling ({full_cpu:.0f} s of CPU time; "
            f"{args.full_n / full:.3f} samples/s, {sum(lengths)} tokens) + {load_s:.1f} s to load the model for it"
        )
    emit(result, args.json, "\n".join(lines))


if __name__ == "__main__":
    main()
