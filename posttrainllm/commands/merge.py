"""`posttrainllm merge`: interpolate a tuned model back toward its base, no training. Every check that needs no
weights runs first (exit 2); then each merge streams tensor by tensor (posttrainllm/merging/) into the output
directory, which follows the project's claim and --overwrite rules (posttrainllm/rundir/outdir.py)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

from posttrainllm import __version__
from posttrainllm.errors import ConfigErrors, ModelStructureError, UsageError, shorten
from posttrainllm.reporting import banner
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

MERGE_RECORD = "merge.json"
RESULTS = "merge_results.json"
CARD = "README.md"
FORMULA = "θ = θ_base + s·(θ_tuned − θ_base)"


def config_problems(cfg: RunConfig) -> list[str]:
    """The merge's own cross-checks (the options' ranges are checked by the option table), all at once."""
    problems = []
    linear = cfg.depth_schedule == "linear"
    if linear and cfg.bottom_alpha is None:
        problems.append("--depth-schedule linear needs --bottom-alpha B (block 0's s, in [0, 1])")
    if cfg.bottom_alpha is not None and not linear:
        problems.append("--bottom-alpha goes with --depth-schedule linear")
    if cfg.depth_schedule != "geometric" and (cfg.llrd != 1.0 or cfg.llrd_bottom_scale):
        problems.append(
            f"--llrd / --llrd-bottom-scale set the geometric schedule: not with --depth-schedule {cfg.depth_schedule}"
        )
    problems += _alpha_problems(list(cfg.alpha or []))
    budget = getattr(cfg, "max_forgetting", None)  # --alpha is required unless it is given (the option table)
    if budget is not None:
        if cfg.alpha:
            problems.append("--max-forgetting chooses α itself: give it or --alpha, not both")
        if not cfg.ood_eval:
            problems.append("--max-forgetting needs --ood-eval FILE: the budget is the held-out perplexity change")
        if cfg.depth_schedule != "geometric" or cfg.llrd != 1.0 or cfg.llrd_bottom_scale:
            problems.append("--max-forgetting searches uniform merges: not with a depth schedule")
    if cfg.discard_weights and not (cfg.eval_dataset or cfg.ood_eval):
        problems.append("--discard-weights keeps only measurements: give --eval-dataset and/or --ood-eval")
    return problems


def alpha_folder(alpha: float) -> str:
    """The folder of one merge of several (its label in the results: alpha=A)."""
    return f"alpha-{alpha:g}"


def _alpha_problems(alphas: list[float]) -> list[str]:
    """A value given twice, or two values that name one folder (alpha-A/ keeps 6 significant digits)."""
    twice = sorted({a for a in alphas if alphas.count(a) > 1})
    problems = [f"--alpha {', '.join(f'{a:g}' for a in twice)} given more than once"] if twice else []
    by_folder: dict[str, list[float]] = {}
    for a in dict.fromkeys(alphas):
        by_folder.setdefault(alpha_folder(a), []).append(a)
    for folder, values in by_folder.items():
        if len(values) > 1:
            problems.append(
                f"--alpha {' and '.join(repr(v) for v in values)} both name {folder}/ (values are kept to 6 "
                "significant digits): give values that differ within them"
            )
    return problems


def _checks(command: str, values) -> list[str]:
    return config_problems(cast("RunConfig", SimpleNamespace(**values)))


SPEC = CommandSpec(
    name="merge",
    help="Merge a tuned model back toward its base, no training: θ = θ_base + s·(θ_tuned − θ_base), s = --alpha "
    "(WiSE-FT) or set per block by a depth schedule (--llrd γ, or --depth-schedule linear: LiNeS); several --alpha "
    "values with --eval-dataset/--ood-eval measure each merge.",
    checks=(_checks,),
)


def schedule_of(cfg: RunConfig) -> dict:
    """The schedule as merge.json records it (γ resolved later from the block count for a bottom scale)."""
    if cfg.depth_schedule == "linear":
        name = "linear"
    else:
        name = "geometric" if (cfg.llrd != 1.0 or cfg.llrd_bottom_scale) else "uniform"
    return {
        "name": name,
        "gamma": cfg.llrd if name == "geometric" and not cfg.llrd_bottom_scale else None,
        "llrd_bottom_scale": cfg.llrd_bottom_scale or None,
        "bottom_alpha": cfg.bottom_alpha,
        "tied_embeddings": cfg.tied_embeddings,
        "block_path": cfg.llrd_blocks,
    }


def _gamma(cfg: RunConfig, base) -> float:
    """The geometric schedule's γ: --llrd, or the one --llrd-bottom-scale gives on the base's block count."""
    if not cfg.llrd_bottom_scale or cfg.depth_schedule == "linear":
        return cfg.llrd
    from posttrainllm.merging.sources import num_blocks
    from posttrainllm.planning import bottom_scale_gamma

    n = num_blocks(base.config)
    if n is None:
        raise UsageError(f"--llrd-bottom-scale: the config of --base {base.ref} does not say how many blocks it has")
    return bottom_scale_gamma(cfg, n)


def _scales(cfg: RunConfig, base, gamma: float, stored: list[str]):
    """One MergeScales per --alpha, from the layer-decay plan of the base's architecture (built on the meta device:
    no weights); `stored` (the base's tensor names) are matched to the model's parameters."""
    from posttrainllm import llrd, merging
    from posttrainllm.merging.sources import checkpoint_names

    model = _meta_model(base, cfg.trust_remote_code) if schedule_of(cfg)["name"] != "uniform" else None
    aliases = checkpoint_names(model, stored) if model is not None else {}
    out = []
    for a in cfg.alpha:
        try:
            if model is None:
                out.append(merging.MergeScales({}, "uniform", float(a)))
                continue
            scales = merging.merge_scales(
                model,
                a,
                gamma=gamma,
                bottom_alpha=cfg.bottom_alpha,
                tied_policy=cfg.tied_embeddings,
                block_path=cfg.llrd_blocks,
            )
            scales.aliases = aliases
            out.append(scales)
        except llrd.BlockStructureError as e:
            example = e.candidates[0][0] if e.candidates else "model.layers"
            raise ModelStructureError(
                f"merge: {e}. Fix: name the block list with --llrd-blocks PATH, e.g. --llrd-blocks {example}; or "
                "merge uniformly (no depth schedule)"
            ) from None
        except llrd.LLRDArgumentError as e:
            raise UsageError(f"--llrd-blocks: {e}" if e.field == "block_path" else f"merge: {e}") from None
    return out


def _meta_model(base, trust_remote_code: bool):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(base.path), trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def _sources(cfg: RunConfig):
    """Both sources resolved and checked against each other: architecture, output directory, tensor names and
    shapes (headers only), tokenizers. Every refusal is a UsageError before a weight is read."""
    from posttrainllm import merging
    from posttrainllm.merging import sources as src

    base = src.resolve_source(cfg.base, "--base", adapter_ok=False, trust_remote_code=cfg.trust_remote_code)
    tuned = src.resolve_source(cfg.model, "--model", adapter_ok=True, trust_remote_code=cfg.trust_remote_code)
    src.check_architectures(base, tuned)
    src.check_output_dir(cfg.output_dir, [("--base", base), ("--model", tuned)])
    base_tensors = merging.SafetensorsSource(base.path)
    tuned_tensors = None
    if tuned.is_adapter:
        from posttrainllm.merging.adapters import check_adapter

        check_adapter(base, tuned, base_tensors)
    else:
        tuned_tensors = merging.SafetensorsSource(tuned.path)
        mismatch = merging.first_mismatch(base_tensors, tuned_tensors)
        if mismatch is not None:
            raise UsageError(f"--base and --model differ in their tensor {mismatch.what}: {mismatch}")
    src.check_tokenizers(base.path, src.tokenizer_dir(tuned, base), cfg.trust_remote_code)
    return base, tuned, base_tensors, tuned_tensors


def main(cfg: RunConfig) -> None:
    """posttrainllm merge: checks, then one streamed merge per --alpha, then (with an eval set) the frontier."""
    from posttrainllm.merging import sources as src
    from posttrainllm.rundir import outdir
    from posttrainllm.training import quiet_progress_bars

    problems = config_problems(cfg)
    if problems:
        raise ConfigErrors(problems)
    quiet_progress_bars()
    base, tuned, base_tensors, tuned_tensors = _sources(cfg)
    budget = None
    if cfg.max_forgetting is not None:  # α chosen before anything is written
        if tuned_tensors is None:
            tuned_tensors = _adapter_tensors(base, tuned, base_tensors, cfg.trust_remote_code)
        budget = _budget(cfg, base, tuned, tuned_tensors)
        cfg = dataclasses.replace(cfg, alpha=[budget["alpha"]])
    gamma = _gamma(cfg, base)
    # the plan on the meta device: a bad --llrd-blocks fails here, before the output directory is claimed
    all_scales = _scales(cfg, base, gamma, base_tensors.names())
    measuring = bool(cfg.eval_dataset or cfg.ood_eval)
    examples = _eval_examples(cfg) if cfg.eval_dataset else None  # a bad eval set fails before anything is written
    run_dir = outdir.prepare(cfg)
    with run_dir:
        if tuned_tensors is None:
            tuned_tensors = _adapter_tensors(base, tuned, base_tensors, cfg.trust_remote_code)
        records = {"base": src.source_record(base), "model": src.source_record(tuned), "budget": budget}
        out = Path(cfg.output_dir).expanduser()
        single = len(all_scales) == 1 and not cfg.discard_weights
        targets = [out if single else out / alpha_folder(s.alpha) for s in all_scales]
        run_dir.start()
        names = _top_names(targets, single, cfg, tuned_tensors)
        run_dir.own(names)
        jobs = list(zip(all_scales, targets))
        _write_all(cfg, jobs, gamma, (base, tuned, base_tensors, tuned_tensors), records, out, names)
        if measuring:
            from posttrainllm.merging import frontier

            pairs = [(s.alpha, d) for s, d in zip(all_scales, targets)]
            extra = {"budget": budget} if budget is not None else None  # merge.json goes with --discard-weights
            frontier.measure_and_report(cfg, base.path, pairs, out / RESULTS, schedule_of(cfg), examples, extra)
            if cfg.discard_weights:
                for target in targets:
                    shutil.rmtree(target, ignore_errors=True)
        run_dir.finish()
    if measuring:
        banner.console.print(f"results: {out / RESULTS}")
    if budget is not None:
        banner.print_budget({**budget, "kept_gain": None, "unmerged_dir": cfg.model})
        if budget["only_base"]:
            from posttrainllm.errors import BudgetNotMet

            raise BudgetNotMet(
                f"--max-forgetting {cfg.max_forgetting:g}: only the base meets it (every merge measured, down to α "
                f"{min(t['alpha'] for t in budget['tried']):g}, forgets more); {out} holds the base (α 0)"
            )


def _budget(cfg: RunConfig, base, tuned, tuned_tensors) -> dict:
    """--max-forgetting: the largest uniform α within the budget (merging/budget.py), measured on models loaded in
    memory and scored at --precision; the tuned model of an adapter is the base with the merged adapter's tensors."""
    from posttrainllm.evaluate import load_for_eval
    from posttrainllm.merging import budget as B
    from posttrainllm.merging import sources as src
    from posttrainllm.models import pick_precision

    trust = cfg.trust_remote_code
    base_model, _ = load_for_eval(str(base.path), trust_remote_code=trust)
    model, tokenizer = load_for_eval(str(base.path if tuned.is_adapter else tuned.path), trust_remote_code=trust)
    if tuned.is_adapter:
        names = src.checkpoint_names(model, tuned_tensors.names())
        state = {names.get(n, n): tuned_tensors.read(n).to(model.dtype) for n in tuned_tensors.names()}
        model.load_state_dict(state, strict=False)
    texts = [str(p) for p in cfg.ood_eval]
    return B.search_models(model, base_model, tokenizer, texts, cfg.max_length, cfg.max_forgetting,
        batch_size=cfg.eval_batch_size, precision=pick_precision(cfg.precision))  # fmt: skip


def _eval_examples(cfg: RunConfig):
    from posttrainllm import data

    return data.load(cfg.eval_dataset)


def _summary(scales, target: Path) -> str:
    """One line per merge: where it went and the s it gave the bottom and the top of the model."""
    if scales.schedule == "uniform":
        how = f"s = {scales.alpha:g} everywhere"
    else:
        s = {r["block"]: r["scale"] for r in scales.rows}
        n = scales.num_blocks
        how = f"{scales.schedule}: s = {s['block_0']:.4g} at block 0 (and the embeddings) … {s[f'block_{n - 1}']:.4g}"
        how += f" at block {n - 1}, {s['head']:.4g} for the head"
    return f"merged α = {scales.alpha:g} ({how}) into {target}"


def _top_names(targets: list[Path], single: bool, cfg: RunConfig, tuned_tensors) -> list[str]:
    """The top-level names this merge writes into the output directory (recorded as ours before writing them)."""
    from posttrainllm.merging import planned_weight_files
    from posttrainllm.merging.sources import CONFIG_FILES, TOKENIZER_FILES

    if single:
        weights = planned_weight_files([(n, *tuned_tensors.meta(n)) for n in tuned_tensors.names()])
        return [*weights, *CONFIG_FILES, *TOKENIZER_FILES, CARD, MERGE_RECORD]
    return [t.name for t in targets] + ([RESULTS] if (cfg.eval_dataset or cfg.ood_eval) else [])


def _adapter_tensors(base, tuned, base_tensors, trust_remote_code: bool):
    """A LoRA adapter merged into --base, as the tuned tensors (restricted to the names the base stores)."""
    from posttrainllm import merging
    from posttrainllm.merging import sources as src

    state = src.merged_adapter_state(base, tuned, trust_remote_code)
    missing = [k for k in base_tensors.names() if k not in state]
    if missing:
        raise UsageError(f"--model {tuned.ref}: the adapter merged into --base lacks tensor {missing[0]}")
    tensors = merging.StateDictSource({k: state[k] for k in base_tensors.names()})
    mismatch = merging.first_mismatch(base_tensors, tensors)
    if mismatch is not None:
        raise UsageError(f"--base and --model differ in their tensor {mismatch.what}: {mismatch}")
    return tensors


def _write_all(cfg: RunConfig, jobs, gamma, sources, records: dict, out: Path, names: list[str]) -> None:
    """Every merge of `jobs` ((scales, target) pairs) written. On any failure (a non-finite tensor, a full disk, an
    interrupt) what this run wrote at the top of `out` (its recorded `names`) is removed: a merge cut short is never
    left to be taken for one; a non-finite tensor becomes one line naming its file."""
    from posttrainllm import merging

    base, tuned, base_tensors, tuned_tensors = sources
    try:
        for scales, target in jobs:
            _write_one(cfg, scales, gamma, target, base, tuned, base_tensors, tuned_tensors, records)
            banner.console.print(_summary(scales, target))
    except BaseException as e:
        for name in names:
            p = out / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            elif p.is_file() or p.is_symlink():
                p.unlink(missing_ok=True)
        if isinstance(e, merging.NonFiniteTensor):
            raise _non_finite(e, sources) from None
        raise


def _non_finite(e, sources) -> UsageError:

    base, tuned, base_tensors, tuned_tensors = sources
    if e.side == "merged":
        return UsageError(
            f"merge: tensor {e.name} overflows when merged (--base and --model are finite there, but their difference "
            "is not in its dtype); nothing was written; merge a float32 copy of both models"
        )
    flag, src, tensors = ("--base", base, base_tensors) if e.side == "base" else ("--model", tuned, tuned_tensors)
    file = tensors.file_of(e.name)
    where = f"in {file}" if file is not None else f"(the LoRA adapter merged into --base {shorten(base.ref)})"
    return UsageError(
        f"{flag} {shorten(src.ref)}: tensor {e.name} {where} holds NaN or infinite values, so no merge of it is a "
        "model; nothing was written; pass a checkpoint with finite weights"
    )


def _write_one(cfg: RunConfig, scales, gamma, target: Path, base, tuned, base_tensors, tuned_tensors, records) -> None:
    """One merged model directory: weights (streamed), config and tokenizer files, merge.json, model card."""
    from posttrainllm import merging
    from posttrainllm.merging import sources as src
    from posttrainllm.rundir.layout import write_json

    target.mkdir(parents=True, exist_ok=True)
    scale_of = scales.scale_of if scales.by_name else (lambda _name, a=scales.alpha: a)
    weights = merging.merge_streamed(base_tensors, tuned_tensors, scale_of, target)
    config_from = base.path if tuned.is_adapter else tuned.path
    for name in src.CONFIG_FILES:
        if (config_from / name).is_file():
            shutil.copyfile(config_from / name, target / name)
    tok_dir = src.tokenizer_dir(tuned, base)
    for name in src.TOKENIZER_FILES:
        if (tok_dir / name).is_file():
            shutil.copyfile(tok_dir / name, target / name)
    schedule = {**schedule_of(cfg), "gamma": gamma if scales.schedule == "geometric" else None}
    schedule.update(num_blocks=scales.num_blocks, depths=scales.rows)
    record = {
        "alpha": scales.alpha,
        "formula": FORMULA,
        "schedule": schedule,
        "base": records["base"],
        "model": records["model"],
        **({"budget": records["budget"]} if records.get("budget") else {}),
        "weights": weights,
        "command": ["posttrainllm", *cfg.argv],
        "posttrainllm_version": __version__,
    }
    (target / CARD).write_text(_card(record), encoding="utf-8")
    write_json(target / MERGE_RECORD, record)


def _card(record: dict) -> str:
    s = record["schedule"]
    lines = [
        "---",
        "tags: [posttrainllm, merge]",
        "---",
        "",
        f"# Merge of {record['model']['ref']} toward {record['base']['ref']}",
        "",
        f"Made by `posttrainllm merge`, no training: every parameter is {FORMULA}.",
        "",
        f"- alpha (s at the top block and head): {record['alpha']:g}",
        f"- schedule: {s['name']}"
        + (f", γ = {s['gamma']:.6g}" if s.get("gamma") else "")
        + (f", bottom alpha = {s['bottom_alpha']:g}" if s.get("bottom_alpha") is not None else ""),
        f"- base: {record['base']['ref']} ({record['base']['kind']})",
        f"- tuned: {record['model']['ref']} ({record['model']['kind']})",
        "",
    ]
    if s.get("depths"):
        lines += ["| depth | s |", "|---|---|"]
        lines += [f"| {r['block']} | {r['scale']:.6g} |" for r in s["depths"]]
        lines.append("")
    lines.append("The sources' SHA-256 hashes and the whole schedule are in `merge.json`.")
    return "\n".join(lines) + "\n"
