"""`posttrainllm eval`: perplexity per text file (with --reference, the per-token KL to a base), optional SFT
completion loss; --json prints only JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from posttrainllm.constants import DEFAULT_WINDOW
from posttrainllm.models.vocab import PROBE as _TOKENIZER_PROBE
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def _something_to_evaluate(command: str, v: Mapping[str, Any]) -> list[str]:
    if not v.get("text") and not v.get("sft_dataset"):
        return ["nothing to evaluate: give --text FILE (repeatable) and/or --sft-dataset FILE"]
    return []


SPEC = CommandSpec(
    name="eval",
    help="Perplexity of text files (non-overlapping windows) and completion loss on an instruction set.",
    max_length=DEFAULT_WINDOW,
    checks=(_something_to_evaluate,),
)


def _eval_reference(cfg: RunConfig, tokenizer):
    """eval --reference: the reference model, checked to tokenize like the model (KL compares token by token)."""
    from posttrainllm import evaluate as ev
    from posttrainllm.errors import UsageError

    ref_model, ref_tok = ev.load_for_eval(cfg.reference, trust_remote_code=cfg.trust_remote_code)
    ids = tokenizer(_TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
    if ref_tok(_TOKENIZER_PROBE, add_special_tokens=False)["input_ids"] != ids:
        raise UsageError(
            f"--reference {cfg.reference} tokenizes text differently from --model {cfg.model}: the KL compares "
            "token by token, so pass the model's own base"
        )
    return ref_model


def main(cfg: RunConfig) -> None:
    """posttrainllm eval: perplexity per text file, optional SFT completion loss; --json prints only JSON."""
    from posttrainllm import evaluate as ev
    from posttrainllm.config.recipe import producing_recipe
    from posttrainllm.evaluate.precision import scoring_autocast
    from posttrainllm.models import pick_precision, resolve_model
    from posttrainllm.planning import clamp_max_length
    from posttrainllm.reporting import banner
    from posttrainllm.training import quiet_progress_bars

    quiet_progress_bars()
    precision = pick_precision(cfg.precision)  # before any model loads: fp16 on a CPU is a usage error
    model_path, _ = resolve_model(
        cfg.model, hint=lambda: producing_recipe(cfg.recipe, cfg.model), trust_remote_code=cfg.trust_remote_code
    )
    model, tokenizer = ev.load_for_eval(model_path, trust_remote_code=cfg.trust_remote_code)
    from posttrainllm.models import max_positions

    cfg, clamped = clamp_max_length(cfg, max_positions(model_path, cfg.trust_remote_code))
    for note in clamped:
        print(f"note: {note}", file=sys.stderr)
    reference = _eval_reference(cfg, tokenizer) if cfg.reference else None
    sft_examples = None
    if cfg.sft_dataset:
        from posttrainllm import data

        sft_examples = data.load(cfg.sft_dataset)  # memory-mapped; scored in chunks
    with scoring_autocast(precision):
        results = ev.evaluate_files(
            model,
            tokenizer,
            list(cfg.text),
            cfg.max_length,
            sft_examples=sft_examples,
            progress=True,  # on stderr: --json keeps stdout for the JSON
            batch_size=cfg.eval_batch_size,
            reference=reference,
        )
    if cfg.json:
        print(json.dumps(ev.json_ready(results), allow_nan=False))
        return
    from rich.table import Table

    t = Table(title=f"eval: {cfg.model} (windows of {cfg.max_length} tokens)", title_justify="left")
    cols = ("input", "perplexity", "tokens") + (("KL(reference ‖ model)/token",) if reference is not None else ())
    for col in cols:
        t.add_column(col, justify="left" if col == "input" else "right")
    for name, r in results.items():
        kl = [f"{r['kl']:.4f}" if r.get("kl") is not None else "-"] if reference is not None else []
        if "perplexity" in r:
            t.add_row(name, f"{r['perplexity']:.4f}", str(r["tokens"]), *kl)
        else:
            t.add_row(name + " (completion loss)", f"{r['loss']:.4f}", str(r.get("completion_tokens", "")), *kl)
    banner.console.print(t)
