"""Every forgetting method at equal in-domain loss, in a setting of the regime study (SmolLM2-135M-Instruct, or
--family gemma3: Gemma 3 270M).

    python studies/methods.py                        # train, merge and evaluate every cell (resumable)
    python studies/methods.py --phase report         # only the tables and the frontier plot, from what has finished
    python studies/methods.py --seeds 2 --heldout-offset 40000    # an independent replication: other seed, texts
    python studies/methods.py --only kl,llrd0.9      # a subset of the methods (names as in METHODS)
    python studies/methods.py --setting shakespeare  # regime.py's Shakespeare setting (out: methods-shakespeare/)
    python studies/methods.py --domain my_text.txt --lrs 3e-5,1e-4,3e-4   # a domain of yours (out: methods-my_text/)
    python studies/methods.py --family gemma3 --setting shakespeare --steps 80 --lrs 3e-5 --max-forgetting 10
                                                     # Gemma 3 270M, with the budgeted merge of each merged cell

The default setting is regime.py's `code` one (`posttrainllm finetune` on the stdlib modules up to typing.py,
240 steps of batch 4 x 192 tokens from the healed base, the same arguments), run first by `studies/regime.py`, whose
healed base, data files and flat runs this script reuses (a flat cell of regime.py is not trained again). Each
method is one extra group of CLI arguments on that run (the same in --setting shakespeare, on Tiny Shakespeare):

  flat         the flat LR grid (1e-5, 3e-5, 1e-4, 3e-4; regime.py's runs): the baseline a careful user tunes
  llrd0.9      --llrd 0.9 (block 0 at 0.9^29 = 0.047 of the top's LR)
  llrd0.97     --llrd 0.97 (block 0 at 0.41)
  replay5      --replay-dataset (documentation prose the base saw, disjoint from every held-out text) at 5%
  replay25     the same at 25%
  kl           --kl-to-base 0.5 (the LM loss plus 0.5 x the per-token KL to the starting model)
  selfreplay   --self-replay 256 at --replay-ratio 0.25 (samples of the starting model, no replay data needed)
  dft          --loss-type dft (Dynamic Fine-Tuning: each token's NLL weighted by its own probability, detached)
  dftkl        --loss-type dft --kl-to-base 0.5 (DFT with the KL anchor: the ASFT form)
  sdft         `posttrainllm sdft` (TRL's SDFTTrainer) in place of finetune, on the same training text cut into
               demonstrations: a prompt of about 96 tokens and its true continuation, which the teacher (the
               model's moving average) is shown; the student samples its own continuation of up to 96 tokens
  (each method at flat's best LR, 3e-5, and the anchoring ones at 1e-4 too: ORDER lists the cells)
  merges       no training: `posttrainllm merge` of a trained cell toward the healed base, uniform (WiSE-FT,
               alpha 0.5 and 0.75) and depth-scaled (--llrd 0.9 with alpha 1: layer decay after training)

Every model, trained or merged, is scored the same way, by `posttrainllm eval --reference HEALED`: in-domain, the
log-perplexity of a 32k-character slice of the held-out stdlib modules; forgetting, the perplexity change and the
per-token KL(healed || model) on held-out documentation prose and Shakespeare (--heldout-chars each, fixed files, the
same for every seed), and the change of the Alpaca completion loss (the last 99 examples: instruction following).
Results: studies/out/methods/ (not committed); tables and docs/methods_frontier.png go into docs/results.md by hand.

--domain FILE runs the comparison on a text of your own: `finetune` on its first 90% (by characters), in-domain
eval on 32,000 characters from the start of its last 10%, forgetting on code, prose, Shakespeare and Alpaca (pick a
domain unlike all of them); every method at every --lrs (flat first), the flat and llrd0.9 cells merged. The healed
base is made first if regime.py has not made it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))

from common import FAMILIES, cli, machine, model_paths, splits  # noqa: E402
from regime import COMMON, HEAL_CHARS, family_out, heal  # noqa: E402
from regime import OUT as REGIME_OUT  # noqa: E402
from regime import evaluate as regime_evaluate  # noqa: E402
from regime import prepare_data as regime_data  # noqa: E402

OUT = ROOT / "studies" / "out" / "methods"
STEPS = 240
REPLAY_CHARS = 600_000
SETTINGS = {
    # name: (the training text, the in-domain eval text, the held-out texts, the texts averaged as "forgetting")
    # code: the documentation prose is about the very modules trained on, and a code fine-tune improves it; it is
    # reported, not averaged in. shakespeare: everything but Shakespeare is unlike the training text.
    "code": ("code_train", "code_eval", ("prose", "shakespeare"), ("shakespeare", "alpaca")),
    "shakespeare": ("shakespeare_train", "shakespeare_eval", ("code", "prose"), ("code", "prose", "alpaca")),
}
DOMAIN = ("domain_train", "domain_eval", ("code", "prose", "shakespeare"), ("code", "prose", "shakespeare", "alpaca"))
DOMAIN_LRS = "3e-5,1e-4,3e-4"
DOMAIN_EVAL_CHARS = 32_000
SETTING = "code"  # set by --setting or --domain
DOMAIN_FILE: Path | None = None
TRAIN_TEXT, IN_DOMAIN, HELD_OUT, FORGET = SETTINGS[SETTING]
FAMILY = "smollm2"  # set by --family


def use_setting(name: str, domain: Path | None = None) -> None:
    """The setting of this process: one of SETTINGS, or (`domain`) a text file of the user's named `name`."""
    global SETTING, TRAIN_TEXT, IN_DOMAIN, HELD_OUT, FORGET, DOMAIN_FILE  # noqa: PLW0603 (one setting per process)
    SETTING, DOMAIN_FILE = name, domain
    TRAIN_TEXT, IN_DOMAIN, HELD_OUT, FORGET = DOMAIN if domain else SETTINGS[name]


def use_family(family: str, steps: int) -> None:
    """The model family and step count of this process: regime.py's folder of that family holds its healed base."""
    global REGIME_OUT, STEPS, FAMILY  # noqa: PLW0603 (one family per process)
    REGIME_OUT, STEPS, FAMILY = family_out(REGIME_OUT, family), steps, family


MERGE_ALPHAS = "0.5,0.75"
MERGE_DEPTH_GAMMA = "0.9"

# method name -> [(LR, extra CLI arguments)]
METHODS: dict[str, list[str]] = {
    "flat": [],
    "kl": ["--kl-to-base", "0.5"],
    "llrd0.9": ["--llrd", "0.9"],
    "llrd0.97": ["--llrd", "0.97"],
    "replay25": ["--replay-ratio", "0.25", "--replay-dataset", "{replay}"],
    "replay5": ["--replay-ratio", "0.05", "--replay-dataset", "{replay}"],
    "selfreplay": ["--self-replay", "256", "--replay-ratio", "0.25"],
    "dft": ["--loss-type", "dft"],
    "dftkl": ["--loss-type", "dft", "--kl-to-base", "0.5"],
    "sdft": ["--max-completion-length", "96"],
}
# the methods trained by another command than finetune, on the training text as that command's rows (a data file)
COMMANDS = {"sdft": ("sdft", "demos")}
DEMO_CHARS = 340  # a demonstration's prompt, and its continuation: about 96 tokens of Shakespeare each (Gemma 3)
# the cells, most informative first: the flat grid (3e-5 was flat's best in-domain LR at 240 steps, so 1e-5 brackets
# it), each method at flat's best LR, then at 1e-4 where the anchoring methods have room to reach flat's in-domain loss
ORDER = [
    ("flat", "1e-4"), ("flat", "3e-4"), ("flat", "3e-5"), ("flat", "1e-5"),
    ("kl", "3e-5"), ("llrd0.9", "1e-4"), ("replay25", "3e-5"), ("llrd0.97", "1e-4"), ("kl", "1e-4"),
    ("selfreplay", "3e-5"), ("llrd0.9", "3e-5"), ("replay5", "3e-5"), ("llrd0.97", "3e-5"), ("replay25", "1e-4"),
    # the Shakespeare setting, where flat's best LR is 1e-4: each method there, and layer decay also at 3e-4 (its
    # lower blocks train at a fraction of the LR, so a higher top LR is where it can reach flat's in-domain loss)
    ("replay5", "1e-4"), ("selfreplay", "1e-4"), ("llrd0.9", "3e-4"), ("llrd0.97", "3e-4"),
    # DFT (its loss weights each token by its probability, so it moves less per step than the NLL) with and without
    # the KL anchor, at flat's best LR and at 1e-4
    ("dft", "3e-5"), ("dftkl", "3e-5"), ("dft", "1e-4"), ("dftkl", "1e-4"),
    # SDFT (on-policy self-distillation from a teacher shown the true continuation) at flat's best LR, and at 3e-4
    # and 1e-4: at flat's LR its KL to a teacher that is nearly the student barely moves it from the base
    ("sdft", "3e-5"), ("sdft", "3e-4"), ("sdft", "1e-4"),
]  # fmt: skip
# which trained cells are merged back toward the base (method, LR)
MERGED = [("flat", "1e-4"), ("flat", "3e-4"), ("flat", "3e-5"), ("llrd0.9", "1e-4")]


def prepare_data(out: Path, heldout_chars: int, offset: int) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    sp = splits()
    texts = {
        "code_eval": sp["code_held"][offset : offset + 32_000],
        "code": sp["code_held"][offset + 32_000 : offset + 32_000 + heldout_chars],
        "prose": sp["docs_held"][offset : offset + heldout_chars],
        "shakespeare": sp["shakespeare_held"][offset : offset + heldout_chars],
        "shakespeare_eval": sp["shakespeare_held"][offset + heldout_chars : offset + heldout_chars + 32_000],
        # replayed prose: documentation the base saw in kind, after the healing slice, no held-out document
        "replay": sp["docs_train"][HEAL_CHARS : HEAL_CHARS + REPLAY_CHARS],
    }
    if DOMAIN_FILE is not None:  # the first 90% to train on, the start of the last 10% as the in-domain eval
        text = DOMAIN_FILE.read_text(encoding="utf-8")
        cut = int(len(text) * 0.9)
        texts["domain_train"], texts["domain_eval"] = text[:cut], text[cut : cut + DOMAIN_EVAL_CHARS]
    else:
        texts[TRAIN_TEXT] = sp[TRAIN_TEXT]
    files = {"demos": out / "demos.json"}
    files["demos"].write_text(json.dumps(demonstrations(texts[TRAIN_TEXT])))
    for key, text in texts.items():
        files[key] = out / f"{key}.txt"
        files[key].write_text(text, encoding="utf-8")
    files["alpaca_val"] = out / "alpaca_val.json"
    files["alpaca_val"].write_text(json.dumps(sp["alpaca_val"]))
    # the training run's own eval set: the same file as regime.py's setting, so that its flat runs are reusable
    files["regime_eval"] = files["domain_eval"] if DOMAIN_FILE else REGIME_OUT / "data" / f"{SETTING}_eval.txt"
    return files


def demonstrations(text: str, chars: int = DEMO_CHARS) -> list[dict[str, str]]:
    """The training text as prompt/completion rows (sdft's demonstrations): consecutive pieces, each cut at the
    first line end after `chars` characters, a prompt and then its true continuation."""
    rows, i = [], 0
    while True:
        cut = text.find("\n", i + chars) + 1
        end = text.find("\n", cut + chars) + 1 if cut else 0
        if not end:
            return rows
        rows.append({"prompt": text[i:cut], "completion": text[cut:end]})
        i = end


def cells(seeds: list[int], only: list[str] | None, lrs: list[str] | None = None) -> list[dict]:
    """The cells of `seeds` (all methods, or `only` those), each at its LRs (or only at those in `lrs`); with a
    --domain, every method at every LR of `lrs` (default DOMAIN_LRS), flat first."""
    if DOMAIN_FILE is not None:
        pairs = [(m, lr) for m in METHODS for lr in lrs or DOMAIN_LRS.split(",")]
    else:
        pairs = [(m, lr) for m, lr in ORDER if lrs is None or lr in lrs]
    return [
        dict(name=f"{m}-lr{lr}-s{seed}", method=m, lr=lr, seed=seed, extra=METHODS[m])
        for seed in seeds
        for m, lr in pairs
        if only is None or m in only
    ]


def merged(cell: dict) -> bool:
    """Whether a trained cell is merged back toward the base: MERGED's, or with a --domain every flat and llrd0.9."""
    if DOMAIN_FILE is not None:
        return cell["method"] in ("flat", "llrd0.9")
    return (cell["method"], cell["lr"]) in MERGED


def _regime_run(cell: dict) -> Path | None:
    """regime.py's finished flat run of this cell's LR and seed, if it trained as many steps as this study's cells."""
    run = REGIME_OUT / "runs" / f"{SETTING}-flat-lr{cell['lr']}-s{cell['seed']}"
    if not (run / "training_complete.json").is_file():
        return None
    config = json.loads((run / "run_config.json").read_text()) if (run / "run_config.json").is_file() else {}
    return run if config.get("max_steps") == STEPS else None  # another --steps: train this study's own


def train(cell: dict, files: dict, healed: Path, out: Path) -> Path:
    if cell["method"] == "flat" and (reused := _regime_run(cell)) is not None:  # regime.py's run, the same arguments
        return reused
    run_dir = out / "runs" / cell["name"]
    if (run_dir / "training_complete.json").is_file():
        return run_dir
    extra = [a.replace("{replay}", str(files["replay"])) for a in cell["extra"]]
    if cell["method"] in COMMANDS:  # another command, on the training text as its rows, no eval set of that shape
        command, data = COMMANDS[cell["method"]]
        data_args = [command, "--dataset", str(files[data])]
        at = COMMON.index("--max-length")  # its lengths: a demonstration's prompt, and --max-completion-length
        common = COMMON[:at] + COMMON[at + 2 :]
    else:
        data_args = ["finetune", "--dataset", str(files[TRAIN_TEXT]), "--eval-dataset", str(files["regime_eval"]),
                     "--eval-steps", str(STEPS // 4)]  # fmt: skip
        common = COMMON
    print(f"train {cell['name']}", flush=True)
    t = cli(
        [*data_args, "--model", str(healed), "--output-dir", str(run_dir), "--overwrite", "--lr", cell["lr"],
         "--seed", str(cell["seed"]), "--max-steps", str(STEPS), "--warmup-ratio", "0.05", *common, *extra],
        out / "logs" / f"{cell['name']}.log",
    )  # fmt: skip
    (run_dir / "study_wall_s.txt").write_text(f"{t:.1f}\n")
    print(f"  done in {t:.0f} s", flush=True)
    return run_dir


def evaluate(name: str, model: Path, healed: Path, files: dict, out: Path) -> dict:
    """regime.py's evaluation (fp32, KL to the healed base, the Alpaca completion loss) on this setting's in-domain
    and held-out texts."""
    return regime_evaluate(name, model, healed, files, out, keys=(IN_DOMAIN, *HELD_OUT))


def merges(cell: dict, run_dir: Path, healed: Path, files: dict, out: Path, only: tuple[str, ...]) -> None:
    """Uniform merges at MERGE_ALPHAS and the depth-scaled merge (--llrd γ, alpha 1), each evaluated, then deleted;
    `only` names the kinds to make ("uniform", "depth")."""
    kinds = {
        "uniform": ["--alpha", MERGE_ALPHAS],
        f"depth{MERGE_DEPTH_GAMMA}": ["--alpha", "1.0", "--llrd", MERGE_DEPTH_GAMMA],
    }
    for kind, args in kinds.items():
        if not kind.startswith(only):
            continue
        alphas = args[1].split(",")
        names = [f"merge-{kind}-a{a}-{cell['name']}" for a in alphas]
        if all((out / "eval" / f"{n}.json").is_file() for n in names):
            continue
        dest = out / "merged" / f"{kind}-{cell['name']}"
        print(f"merge {kind} {cell['name']}", flush=True)
        t = cli(["merge", "--base", str(healed), "--model", str(run_dir), "--output-dir", str(dest), "--overwrite",
                 *args], out / "logs" / f"merge-{kind}-{cell['name']}.log")  # fmt: skip
        for a, n in zip(alphas, names):
            model = dest / f"alpha-{a}" if len(alphas) > 1 else dest
            res = evaluate(n, model, healed, files, out)
            res["merge_wall_s"] = t / len(alphas)
            (out / "eval" / f"{n}.json").write_text(json.dumps(res))
        shutil.rmtree(dest)  # 0.5 GB each; the measurements are kept


def budget(cell: dict, run_dir: Path, healed: Path, files: dict, out: Path, pct: str, chars: int, offset: int) -> None:
    """`posttrainllm merge --max-forgetting PCT` of a trained cell: the merge picks its own alpha on this setting's
    held-out texts cut at `offset` (other slices than the scored ones), then is scored like every model."""
    name = f"budget{pct}-{cell['name']}"
    if (out / "eval" / f"{name}.json").is_file():
        return
    own = prepare_data(out / "data-budget", chars, offset)
    dest = out / "merged" / name
    ood = [a for key in HELD_OUT for a in ("--ood-eval", str(own[key]))]
    print(f"budget {pct}% {cell['name']}", flush=True)
    t = cli(["merge", "--base", str(healed), "--model", str(run_dir), "--output-dir", str(dest), "--overwrite", *ood,
             "--max-forgetting", pct, "--max-length", "192"], out / "logs" / f"merge-{name}.log")  # fmt: skip
    # scored into a folder of its own first: out/eval holds only finished points
    res = dict(regime_evaluate(name, dest, healed, files, out / "budget", keys=(IN_DOMAIN, *HELD_OUT)))
    res["merge_wall_s"] = t
    for fn in ("merge_results.json", "merge.json"):  # what the merge measured on its own texts, and its choice
        if (dest / fn).is_file():
            res.setdefault("budget_files", {})[fn] = json.loads((dest / fn).read_text())
    (out / "eval" / f"{name}.json").write_text(json.dumps(res))
    shutil.rmtree(dest)  # 0.5 GB; the measurements are kept


def _point(name: str, res: dict, base: dict, wall: str) -> dict:
    """One evaluated model: in-domain NLL, per held-out text the PPL change (%) and KL, the Alpaca loss change (as
    % PPL), the compute, and its family (the method, or which trained cell a merge comes from)."""
    p = {"name": name, "ind": res[f"{IN_DOMAIN}.txt"]["nll"], "wall": wall}
    for key in HELD_OUT:
        r, b = res[f"{key}.txt"], base[f"{key}.txt"]
        p[key] = 100 * (r["perplexity"] / b["perplexity"] - 1)
        p[f"kl_{key}"] = r.get("kl", 0.0)
    p["alpaca"] = 100 * (math.exp(res["sft"]["loss"] - base["sft"]["loss"]) - 1)
    p["forget"] = sum(p[k] for k in FORGET) / len(FORGET)
    p["kl"] = sum(p[f"kl_{k}"] for k in HELD_OUT) / len(HELD_OUT)
    # knob: what moves a point along its family's curve (a merge's alpha, a trained cell's LR)
    if name.startswith("merge-"):  # merge-KIND-aALPHA-CELL
        kind, alpha, cell = name[len("merge-") :].split("-", 2)
        p["family"], p["seed"] = f"merge {kind} of {cell.rsplit('-s', 1)[0]}", cell.rsplit("-s", 1)[1]
        p["knob"] = float(alpha[1:])
    elif name == "healed base":
        p["family"], p["seed"], p["knob"] = "base", "", 0.0
    else:
        p["family"], p["seed"] = name.split("-lr")[0], name.rsplit("-s", 1)[1]
        p["knob"] = float(name.split("-lr", 1)[1].rsplit("-s", 1)[0])
    return p


def _wall(name: str, res: dict, out: Path) -> str:
    if name.startswith(("merge-", "budget")):
        return f"{res.get('merge_wall_s', 0):.0f} (merge)"
    lr, seed = name.split("-lr", 1)[1].rsplit("-s", 1)
    for d in (out / "runs" / name, REGIME_OUT / "runs" / f"{SETTING}-flat-lr{lr}-s{seed}"):
        if (d / "study_wall_s.txt").is_file():
            return d.joinpath("study_wall_s.txt").read_text().strip()
    return ""


UNHEALED = "gguf-base"  # the evaluation of the GGUF before healing: reported by --phase report, not a point


def points(out: Path) -> list[dict]:
    base_file = out / "eval" / "healed.json"
    if not base_file.is_file():
        return []
    base = json.loads(base_file.read_text())
    pts = [_point("healed base", base, base, "0")]
    for ev in sorted((out / "eval").glob("*.json")):
        if ev.stem not in ("healed", UNHEALED):
            res = json.loads(ev.read_text())
            pts.append(_point(ev.stem, res, base, _wall(ev.stem, res, out)))
    return sorted(pts, key=lambda p: p["ind"])


def table(pts: list[dict]) -> str:
    """One row per evaluated model (trained or merged), sorted by in-domain loss."""
    head = ["model", f"in-domain NLL ({SETTING})", *(f"{k} PPL / KL" for k in HELD_OUT), "Alpaca loss (PPL)",
            f"forgetting ({', '.join(FORGET)})", "train s"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in pts:
        cols = [p["name"], f"{p['ind']:.4f}", *(f"{p[k]:+.1f}% / {p[f'kl_{k}']:.4f}" for k in HELD_OUT)]
        lines.append("| " + " | ".join([*cols, f"{p['alpaca']:+.1f}%", f"{p['forget']:+.2f}%", p["wall"]]) + " |")
    return "\n".join(lines)


def _best_at_most(family: list[dict], x: float) -> dict | None:
    """The least-forgetting point of a family whose in-domain NLL is at most x: its points, and where two
    neighbours along the family's knob (LR, or a merge's alpha) straddle x, the point interpolated linearly between
    them at x. None: the family never reaches x."""
    fam = sorted(family, key=lambda p: p["knob"])
    cands = [p for p in fam if p["ind"] <= x + 1e-9]
    for a, b in zip(fam, fam[1:]):
        if min(a["ind"], b["ind"]) < x < max(a["ind"], b["ind"]):
            t = (x - a["ind"]) / (b["ind"] - a["ind"])
            mid = {k: a[k] + t * (b[k] - a[k]) for k in (*HELD_OUT, "alpaca", "forget", "kl", "ind")}
            cands.append({**mid, "name": f"between {a['name']} and {b['name']}"})
    return min(cands, key=lambda p: p["forget"]) if cands else None


def matched(pts: list[dict], seed: str = "1") -> str:
    """Each family at in-domain NLL no worse than the tuned flat run's (flat's best LR): its least-forgetting point
    there (among its LRs, or a merge's alphas with the trained cell itself at alpha 1, interpolated at the tuned
    NLL where two points straddle it), or the family's best in-domain NLL when it never gets that low."""
    flat = [p for p in pts if p["family"] == "flat" and p["seed"] == seed]
    if not flat:
        return "(no flat run yet)"
    tuned = min(flat, key=lambda p: p["ind"])
    fams = _families(pts, seed)
    lines = [f"At in-domain NLL at most the tuned flat run's, {tuned['ind']:.4f} ({tuned['name']}), seed {seed}: "
             "each method's least-forgetting point", "",
             "| method | point | in-domain NLL | " + " | ".join(f"{k} PPL" for k in HELD_OUT)
             + " | Alpaca loss (PPL) | forgetting | mean KL |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for fam, members in sorted(fams.items()):
        if fam == "base":
            continue
        best = _best_at_most(members, tuned["ind"])
        if best is None:
            low = min(p["ind"] for p in members)
            lines.append(f"| {fam} | not reached (best in-domain NLL {low:.4f}) | | | | | | |")
            continue
        vals = " | ".join(f"{best[k]:+.2f}%" for k in (*HELD_OUT, "alpaca", "forget"))
        lines.append(f"| {fam} | {best['name']} | {best['ind']:.4f} | {vals} | {best['kl']:.4f} |")
    return "\n".join(lines)


KEPT = (1.0, 0.95, 0.9, 0.85)  # shares of the tuned flat run's in-domain gain over the base, for at_gains()


def _families(pts: list[dict], seed: str) -> dict[str, list[dict]]:
    """A seed's points by family; a merge family also holds its trained cell (the merge at alpha 1)."""
    fams: dict[str, list[dict]] = {}
    for p in pts:
        if p["seed"] == seed:
            fams.setdefault(p["family"], []).append(p)
    for fam, members in fams.items():
        if fam.startswith("merge "):  # the trained cell is the merge at alpha 1
            members += [{**p, "knob": 1.0} for p in pts if p["name"] == fam.split(" of ", 1)[1] + f"-s{seed}"]
    return fams


def at_gains(pts: list[dict], seed: str = "1") -> str:
    """Each family's least forgetting at in-domain NLL no worse than the level that keeps KEPT shares of the tuned
    flat run's in-domain gain over the healed base (interpolated between a family's points that straddle it)."""
    flat = [p for p in pts if p["family"] == "flat" and p["seed"] == seed]
    base = [p for p in pts if p["family"] == "base"]
    if not flat or not base:
        return "(no flat run yet)"
    tuned = min(flat, key=lambda p: p["ind"])
    levels = [tuned["ind"] + (1 - k) * (base[0]["ind"] - tuned["ind"]) for k in KEPT]
    head = " | ".join(f"{100 * k:.0f}% kept (NLL ≤ {x:.4f})" for k, x in zip(KEPT, levels))
    lines = [f"Seed {seed}: each method's least forgetting (mean of {', '.join(FORGET)}) at in-domain NLL that keeps a "
             f"share of the tuned flat run's gain ({tuned['name']}, {tuned['ind']:.4f}; base {base[0]['ind']:.4f})", "",
             f"| method | {head} |", "|---|" + "---|" * len(KEPT)]  # fmt: skip
    for fam, members in sorted(_families(pts, seed).items()):
        if fam != "base":
            best = [_best_at_most(members, x) for x in levels]
            cols = " | ".join("not reached" if b is None else f"{b['forget']:+.1f}%" for b in best)
            lines.append(f"| {fam} | {cols} |")
    return "\n".join(lines)


def plot(pts: list[dict], dest: Path) -> None:
    """The frontier: in-domain NLL (x) against mean forgetting (y), one marker per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    fams: dict[str, list[dict]] = {}
    for p in pts:
        fams.setdefault(p["family"], []).append(p)
    colours = plt.get_cmap("tab20").colors
    for i, (fam, members) in enumerate(sorted(fams.items())):
        for seed in sorted({p["seed"] for p in members}):  # one curve per seed, along the family's knob
            curve = sorted((p for p in members if p["seed"] == seed), key=lambda p: p["knob"])
            ax.plot([p["ind"] for p in curve], [p["forget"] for p in curve], "--" if fam.startswith("merge") else "-",
                    marker="os^Dv<>"[i % 7], color=colours[i % 20], mfc="none" if seed == "2" else colours[i % 20],
                    label=fam if seed == min(q["seed"] for q in members) else None)  # fmt: skip
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel(f"in-domain NLL ({SETTING}; lower is better)")
    ax.set_ylabel(f"forgetting: mean PPL change vs healed base, % ({', '.join(FORGET)})")
    ax.set_title(f"{FAMILY}, finetune on {SETTING}, {STEPS} steps: every method (hollow: seed 2)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)


def report(out: Path) -> str:
    pts = points(out)
    if not pts:
        return "(no healed evaluation yet)"
    seeds = sorted({p["seed"] for p in pts if p["seed"]})
    parts = [table(pts), *(matched(pts, s) for s in seeds), *(at_gains(pts, s) for s in seeds)]
    unhealed = out / "eval" / f"{UNHEALED}.json"
    if unhealed.is_file():  # the healing's own effect: what the Q4 repair alone does to each text
        base = json.loads((out / "eval" / "healed.json").read_text())
        p = _point("merge-x-a1-unhealed-lr0-s0", json.loads(unhealed.read_text()), base, "")
        cols = ", ".join(f"{k} {p[k]:+.1f}%" for k in (*HELD_OUT, "alpaca"))
        parts.append(f"The GGUF before healing, against the healed base: in-domain NLL {p['ind']:.4f}; {cols}")
    return "\n\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=["all", "report"], default="all")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--only", default=None, help="comma-separated method names (default: all)")
    ap.add_argument("--lrs", default=None, help="only the cells at these LRs (comma-separated, e.g. 1e-4)")
    ap.add_argument("--heldout-chars", type=int, default=20_000)
    ap.add_argument("--heldout-offset", type=int, default=0)
    ap.add_argument("--setting", choices=sorted(SETTINGS), default="code", help="regime.py's setting to compare in")
    ap.add_argument("--domain", type=Path, default=None, help="a text file of yours to compare in (module docstring)")
    ap.add_argument("--out", type=Path, default=None, help=f"default: {OUT} (code), {OUT}-SETTING (others), -FAMILY")
    ap.add_argument("--family", choices=FAMILIES, default="smollm2", help="the real model (regime.py's --family)")
    ap.add_argument("--steps", type=int, default=STEPS, help="steps of a trained cell (regime.py's --steps-code)")
    ap.add_argument("--merge-kinds", default="uniform,depth", help="the merges made of each MERGED cell")
    ap.add_argument("--plot", type=Path, default=None, help="write the frontier plot here (a PNG)")
    ap.add_argument("--max-forgetting", default=None, help="also merge each MERGED cell with this budget (a %%)")
    ap.add_argument(
        "--budget-offset",
        type=int,
        default=None,
        help="where the budget's own held-out texts start (default: offset + 2 x --heldout-chars)",
    )
    args = ap.parse_args()
    if args.domain is not None and not args.domain.is_file():
        ap.error(f"--domain {args.domain}: no such file")
    use_setting(args.domain.stem if args.domain else args.setting, args.domain)
    use_family(args.family, args.steps)
    out: Path = args.out or family_out(OUT if SETTING == "code" else OUT.with_name(f"methods-{SETTING}"), args.family)
    only = args.only.split(",") if args.only else None
    todo = cells([int(s) for s in args.seeds.split(",")], only, args.lrs.split(",") if args.lrs else None)
    if args.phase == "all":
        healed = REGIME_OUT / "healed"
        if not (healed / "training_complete.json").is_file() and DOMAIN_FILE is None and args.family == "smollm2":
            sys.exit("run studies/regime.py first (it heals the base and trains the flat cells)")
        gguf, gguf_dir = model_paths(args.family)
        if not (healed / "training_complete.json").is_file():  # a domain of the user's or another family: heal
            heal(regime_data(REGIME_OUT / "data", 8_000, 0), gguf, REGIME_OUT, 40)
        files = prepare_data(out / "data", args.heldout_chars, args.heldout_offset)
        (out / "meta.json").write_text(json.dumps({"machine": machine(), "argv": sys.argv}, indent=2))
        evaluate("healed", healed, healed, files, out)
        evaluate(UNHEALED, gguf_dir, healed, files, out)  # the Q4 GGUF before healing: its repair is not retention
        for cell in todo:  # a flat cell regime.py has not trained is trained here, with the same arguments
            t0 = time.time()
            try:
                run_dir = train(cell, files, healed, out)
                evaluate(cell["name"], run_dir, healed, files, out)
                if merged(cell):
                    merges(cell, run_dir, healed, files, out, tuple(args.merge_kinds.split(",")))
                    if args.max_forgetting:
                        offset = args.budget_offset
                        if offset is None:
                            offset = args.heldout_offset + 2 * args.heldout_chars
                        budget(cell, run_dir, healed, files, out, args.max_forgetting, args.heldout_chars, offset)
            except RuntimeError as err:  # one failed cell (its log says why) does not stop the others
                print(f"  FAILED {cell['name']}: {err}", flush=True)
                continue
            print(f"  cell {cell['name']}: {time.time() - t0:.0f} s", flush=True)
            print(report(out), flush=True)
    print(report(out))
    if args.plot:
        plot(points(out), args.plot)


if __name__ == "__main__":
    main()
