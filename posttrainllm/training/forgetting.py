"""What a training run measures of its forgetting, around the training the lifecycle runs (posttrainllm/lifecycle.py):
the held-out texts' perplexity and KL to the starting model (`--ood-eval`, through `--eval-cache` when given), the
forgetting probe on the starting model's own samples when there is no held-out text (evaluate/probe.py), and the
forgetting budget (`--max-forgetting`, merging/budget.py) that merges the trained model back toward the starting one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from posttrainllm.constants import DEFAULT_WINDOW
from posttrainllm.context import Setup
from posttrainllm.rundir import checkpoints, signals
from posttrainllm.rundir.layout import is_rank0

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig
    from posttrainllm.spec import CommandSpec


def ood_eval(model, tokenizer, cfg: RunConfig, reference=None) -> dict:
    from posttrainllm.evaluate import evaluate_files

    # grpo / rloo / distill have no --max-length: their held-out text is read in windows of eval's default length
    window = cfg.max_length or DEFAULT_WINDOW
    return evaluate_files(model, tokenizer, list(cfg.ood_eval), window, progress=is_rank0(), reference=reference)


def _cache_args(cfg: RunConfig, model_path: str | None, model, precision: str) -> dict | None:
    """--eval-cache on one process: where the base's held-out evaluation is kept and what identifies the base (what
    its directory holds, and the dtype it is scored in). None: no cache (or several ranks: each scores its own)."""
    from posttrainllm.evaluate.base_cache import base_identity
    from posttrainllm.rundir.layout import world_size

    if not cfg.eval_cache or world_size() > 1:
        return None
    identity = base_identity(model_path or cfg.model, model, precision, cfg.eval_cache)
    return {"cache_dir": cfg.eval_cache, "base_identity": identity}


def ood_before(s: Setup, precision: str) -> dict:
    """The base's held-out results: from --eval-cache when it holds them (else scored now, the model still being the
    base, and kept there), or scored now."""
    from posttrainllm.evaluate.precision import scoring_autocast

    cached = _cache_args(s.cfg, s.model_path, s.model, precision)
    with scoring_autocast(precision):
        if cached is None:
            return ood_eval(s.model, s.tokenizer, s.cfg)
        from posttrainllm.evaluate.base_cache import base_results

        window = s.cfg.max_length or DEFAULT_WINDOW
        return base_results(lambda: s.model, s.tokenizer, list(s.cfg.ood_eval), window, **cached)


def ood_after(s: Setup, model, precision: str, starting: StartingModel | None = None) -> dict:
    """The tuned model's held-out results with the KL to the base: from the cached base (one forward per batch, the
    base not loaded), or against the base loaded again (`starting`: loaded once for every measurement)."""
    from posttrainllm.evaluate.precision import scoring_autocast

    cached = _cache_args(s.cfg, s.model_path, model, precision)
    if cached is None:
        reference = (starting or StartingModel(s, precision))()
        with scoring_autocast(precision):
            return ood_eval(model, s.tokenizer, s.cfg, reference=reference)
    from posttrainllm.evaluate.base_cache import results_against_base

    window = s.cfg.max_length or DEFAULT_WINDOW
    with scoring_autocast(precision):
        return results_against_base(model, s.tokenizer, list(s.cfg.ood_eval), window, progress=None, **cached)


class StartingModel:
    """The starting model loaded again after training (`kl_reference`), on first use only, and then kept for every
    measurement of the run's end that needs it: the held-out KL, the probe, the budget's merges and their scoring."""

    def __init__(self, s: Setup, precision: str):
        self._s, self._precision, self._model, self._loaded = s, precision, None, False

    def __call__(self):
        if not self._loaded:
            self._model = kl_reference(self._s.cfg, self._s.model_path, self._precision)
            self._loaded = True
        return self._model


def kl_reference(cfg: RunConfig, model_path: str | None, precision: str):
    """The base model again, for the forgetting report's KL column: loaded from --model after training (no second
    copy is held while training), on the tuned model's device, in eval mode."""
    from posttrainllm import models

    if not model_path:
        return None
    import torch

    ref = models.load_model(model_path, trust_remote_code=cfg.trust_remote_code, precision=precision)
    if torch.cuda.is_available():
        ref = ref.to("cuda")
    return ref.eval()


def probe_texts(s: Setup, spec: CommandSpec, run_dir) -> list[str] | None:
    """The forgetting probe's texts (evaluate/probe.py), drawn from the starting model before training, for a run
    from a language model without --ood-eval on one process (None otherwise: --forgetting-probe 0, pretrain, a
    reward model, a vision-language model, several ranks)."""
    from posttrainllm.evaluate import probe
    from posttrainllm.rundir.layout import world_size

    cfg = s.cfg
    vlm = getattr(getattr(s.model, "config", None), "vision_config", None) is not None
    if not cfg.forgetting_probe or spec.from_scratch or spec.reward_head or vlm or world_size() > 1:
        return None
    run_dir.own([probe.PROBE_FILE])
    with signals.stop_on_signal("the forgetting probe's sampling"):
        return probe.obtain(s.model, s.tokenizer, Path(cfg.output_dir), n=cfg.forgetting_probe, seed=cfg.seed,
            model_identity=s.model_path or cfg.model, length=probe.probe_length(s.model))  # fmt: skip


def probe_after(s: Setup, model, texts: list[str], precision: str,
                starting: StartingModel | None = None) -> dict | None:  # fmt: skip
    """The probe's KL(start ‖ tuned) per token on its texts, against the starting model loaded again."""
    from posttrainllm.evaluate import probe
    from posttrainllm.evaluate.precision import scoring_autocast

    reference = (starting or StartingModel(s, precision))()
    if reference is None:
        return None
    with scoring_autocast(precision):
        return probe.measure(model, reference, s.tokenizer, texts, probe.probe_length(reference))


def meet_budget(s: Setup, trainer, metrics: dict, measures: dict, precision: str, run_dir, sizes,
                starting: StartingModel):  # fmt: skip
    """--max-forgetting: (the budget record, the output's forgetting results, the output's file sizes). The largest
    uniform merge toward the starting model within the budget (merging/budget.py) becomes the run's output; the
    trained model is kept in OUT/unmerged/. Its in-domain eval loss at α gives the share of the gain it keeps.
    `measures`: {"before", "after"} (the --ood-eval results: the mean perplexity change) or {"probe", "probed"}
    (the probe's texts and its result: without --ood-eval the budget is on the perplexity change of the starting
    model's own samples, exp(KL) - 1, merging/budget.probe_change). `starting`: the starting model, loaded once."""
    from posttrainllm.evaluate import forgetting_report
    from posttrainllm.merging import budget as B

    cfg = s.cfg
    held = "before" in measures
    result, change = _gauge(s, trainer.model, measures, starting, precision)
    merge = None

    def measure(alpha: float):
        nonlocal merge
        if merge is None:
            merge = B.Interpolation(trainer.model, starting())
        merge.set(alpha)
        return change(result())

    at_one = change(measures["after"] if held else measures["probed"])
    found = B.search(measure, cfg.max_forgetting, at_one=at_one)
    record = {"max_forgetting_pct": cfg.max_forgetting, "measure": B.HELD_OUT if held else B.PROBE, **found,
        "unmerged_dir": None, "kept_gain": None}  # fmt: skip
    if not held:
        record["max_probe_kl"] = B.probe_kl_budget(cfg.max_forgetting)
    kept = measures["after"] if held else measures["probed"]
    if found["alpha"] == 1.0 or found["only_base"]:
        if merge is not None:
            merge.set(1.0)
        return record, kept, sizes
    merge.set(1.0)
    unmerged = Path(cfg.output_dir) / B.UNMERGED
    run_dir.own([B.UNMERGED])
    checkpoints.save_final(trainer, s.tokenizer, str(unmerged))
    losses = {}
    if s.prepared.eval is not None:
        for alpha in (0.0, found["alpha"]):
            merge.set(alpha)
            losses[alpha] = _eval_loss(trainer)
    merge.set(found["alpha"])
    sizes = checkpoints.save_final(trainer, s.tokenizer, cfg.output_dir)
    record.update(unmerged_dir=str(unmerged), eval_loss=losses.get(found["alpha"]))
    record["unmerged_results"] = forgetting_report(measures["before"], kept) if held else kept  # the trained model's
    record["kept_gain"] = B.kept_gain(losses.get(0.0), metrics.get("eval_loss"), losses.get(found["alpha"]))
    final = ood_after(s, trainer.model, precision, starting) if held else result()
    return record, final, sizes


def _gauge(s: Setup, model, measures: dict, base, precision: str):
    """(result, change): the budget's measurement of `model` as it is now (the --ood-eval results, or the probe's),
    and the change (%) it gives."""
    from posttrainllm.evaluate import forgetting_report, probe
    from posttrainllm.evaluate.precision import scoring_autocast
    from posttrainllm.merging import budget as B

    if "before" in measures:

        def held_out():
            with scoring_autocast(precision):
                return ood_eval(model, s.tokenizer, s.cfg)

        return held_out, lambda after: B.mean_change(forgetting_report(measures["before"], after))

    def probed():
        reference = base()
        with scoring_autocast(precision):
            return probe.measure(model, reference, s.tokenizer, measures["probe"], probe.probe_length(reference))

    return probed, B.probe_change


def _eval_loss(trainer) -> float | None:
    """The in-domain eval loss of the trainer's model as it is now, without logging it (no entry in the run's log)."""
    loader = trainer.get_eval_dataloader()
    loop = trainer.evaluation_loop(loader, "budget", prediction_loss_only=True, metric_key_prefix="budget")
    return loop.metrics.get("budget_loss")
