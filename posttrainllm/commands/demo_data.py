"""Data for the offline demo, made on the spot from what every Python install has.

* `stdlib_corpus`: Python source code from the running interpreter's standard library, split into a pre-training
  text and a held-out text drawn from disjoint sets of top-level modules.
* `instruction_set`: a small Alpaca-shaped instruction set with simple tasks whose answers are computed (so they
  can be checked): arithmetic, string reversal, case changes, counting, sorting, Python keywords.
* `write_demo_files`: writes both to a folder as pretrain.txt, heldout_code.txt, instructions.jsonl and
  instructions_eval.jsonl.

Everything is deterministic for a given seed (and, for the corpus, a given Python installation).
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
from pathlib import Path

__all__ = ["stdlib_corpus", "instruction_set", "write_demo_files"]

# Folders of the standard library that are not ordinary library code (tests, GUIs, data, bundled wheels, ...).
_SKIP_DIRS = {
    "test",
    "tests",
    "idlelib",
    "tkinter",
    "turtledemo",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "ensurepip",
    "pydoc_data",
    "__pycache__",
    "encodings",
    "lib-dynload",
    "__phello__",
}


def _stdlib_units(stdlib: Path) -> dict[str, list[Path]]:
    """Top-level module name -> its .py files (sorted), skipping _SKIP_DIRS and test files."""
    units: dict[str, list[Path]] = {}
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(
            d for d in dirs if d not in _SKIP_DIRS and not d.startswith(("config-", ".")) and not d.startswith("test")
        )
        rel_root = Path(root).relative_to(stdlib)
        for name in sorted(files):
            if not name.endswith(".py") or name.startswith("test_"):
                continue
            rel = rel_root / name
            top = rel.parts[0] if len(rel.parts) > 1 else rel.stem
            units.setdefault(top, []).append(rel)
    return units


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def stdlib_corpus(max_chars: int = 400_000, seed: int = 0, *, held_out_chars: int | None = None) -> tuple[str, str]:
    """Return (pretrain_text, held_out_text) made of standard-library source files.

    Top-level modules (a module file, or a package with all its files) are listed in sorted order and shuffled with
    `seed`; the first ones fill the held-out text (up to `held_out_chars`, default max_chars // 8), the following
    ones the pre-training text (up to `max_chars`). No module is in both. Each file is preceded by a
    `# ==== Lib/<path> ====` line; files larger than a quarter of the budget (min 20k characters) are skipped for
    variety, as are unreadable ones. Texts are cut at a line boundary to stay within their budget.
    """
    if max_chars < 1:
        raise ValueError("max_chars must be positive")
    held_budget = max(1, max_chars // 8) if held_out_chars is None else held_out_chars
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    units = _stdlib_units(stdlib)
    names = sorted(units)
    random.Random(seed).shuffle(names)
    file_limit = max(20_000, max_chars // 4)

    parts: dict[str, list[str]] = {"held": [], "pre": []}
    sizes = {"held": 0, "pre": 0}
    budgets = {"held": held_budget, "pre": max_chars}
    target = "held" if held_budget > 0 else "pre"
    for name in names:
        if sizes[target] >= budgets[target]:
            if target == "pre":
                break
            target = "pre"
        for rel in units[name]:
            text = _read(stdlib / rel)
            if text is None or not text.strip() or len(text) > file_limit:
                continue
            piece = f"# ==== Lib/{rel.as_posix()} ====\n{text}"
            if not piece.endswith("\n"):
                piece += "\n"
            parts[target].append(piece)
            sizes[target] += len(piece)

    def cut(text: str, budget: int) -> str:
        if len(text) <= budget:
            return text
        end = text.rfind("\n", 0, budget)
        return text[: end + 1] if end > 0 else text[:budget]

    return cut("".join(parts["pre"]), max_chars), cut("".join(parts["held"]), held_budget)


# ----------------------------------------------------------------------------------------------------------------
# Instructions
# ----------------------------------------------------------------------------------------------------------------

_WORDS = [
    "python",
    "banana",
    "window",
    "garden",
    "planet",
    "rocket",
    "silver",
    "forest",
    "orange",
    "bridge",
    "castle",
    "dragon",
    "pencil",
    "summer",
    "winter",
    "guitar",
    "candle",
    "mirror",
    "island",
    "market",
    "yellow",
    "purple",
    "button",
    "coffee",
    "dinner",
    "rabbit",
    "spider",
    "tomato",
    "violin",
    "wizard",
    "apple",
    "river",
    "cloud",
    "stone",
    "light",
    "music",
    "paper",
    "train",
    "horse",
    "ocean",
    "tiger",
    "lemon",
    "house",
    "chair",
    "table",
    "green",
    "water",
    "bread",
    "sugar",
    "night",
]

_PHRASES = [
    "hello world",
    "good morning",
    "the quick brown fox",
    "open the door",
    "learning is fun",
    "python is great",
    "see you soon",
    "a cup of tea",
    "keep it simple",
    "read the manual",
    "small steps count",
    "the sky is blue",
    "time to code",
    "bake a cake",
    "walk the dog",
]

_KEYWORDS = [
    ("What is the Python keyword for defining a function?", "def"),
    ("What is the Python keyword for defining a class?", "class"),
    ("Which Python keyword returns a value from a function?", "return"),
    ("Which Python keyword starts a loop over the items of a sequence?", "for"),
    ("Which Python keyword starts a loop that runs while a condition holds?", "while"),
    ("Which Python keyword brings a module into the current namespace?", "import"),
    ("Which Python keyword creates an anonymous function?", "lambda"),
    ("Which Python keyword leaves a loop early?", "break"),
    ("Which Python keyword skips to the next iteration of a loop?", "continue"),
    ("Which Python keyword starts a block that catches exceptions?", "try"),
    ("Which Python keyword raises an exception?", "raise"),
    ("Which Python keyword does nothing and serves as a placeholder?", "pass"),
    ("Which Python keyword produces a value from a generator?", "yield"),
    ("Which Python keyword tests whether a value is in a container?", "in"),
    ("Which Python keyword is the null value?", "None"),
    ("Which Python keyword opens a context manager block?", "with"),
]


def _fmt_list(nums: list[int]) -> str:
    return ", ".join(str(n) for n in nums)


def _task(rng: random.Random) -> dict:
    kind = rng.randrange(14)
    if kind == 0:
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return {"instruction": f"Add {a} and {b}.", "input": "", "output": str(a + b)}
    if kind == 1:
        a, b = rng.randint(10, 99), rng.randint(1, 99)
        return {"instruction": f"What is {a} minus {b}?", "input": "", "output": str(a - b)}
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return {"instruction": f"Multiply {a} by {b}.", "input": "", "output": str(a * b)}
    if kind == 3:
        w = rng.choice(_WORDS)
        return {"instruction": f"Reverse the word: {w}", "input": "", "output": w[::-1]}
    if kind == 4:
        p = rng.choice(_PHRASES)
        return {"instruction": f"Uppercase: {p}", "input": "", "output": p.upper()}
    if kind == 5:
        p = rng.choice(_PHRASES).title()
        return {"instruction": f"Lowercase: {p}", "input": "", "output": p.lower()}
    if kind == 6:
        w = rng.choice(_WORDS)
        return {"instruction": f"Count the letters in: {w}", "input": "", "output": str(len(w))}
    if kind == 7:
        w = rng.choice(_WORDS)
        n = sum(ch in "aeiou" for ch in w)
        return {"instruction": f"How many vowels are in the word {w}?", "input": "", "output": str(n)}
    if kind == 8:
        w = rng.choice(_WORDS)
        if rng.random() < 0.5:
            return {"instruction": f"What is the first letter of the word {w}?", "input": "", "output": w[0]}
        return {"instruction": f"What is the last letter of the word {w}?", "input": "", "output": w[-1]}
    if kind == 9:
        nums = [rng.randint(0, 99) for _ in range(rng.randint(3, 6))]
        return {
            "instruction": "Sort these numbers in ascending order.",
            "input": _fmt_list(nums),
            "output": _fmt_list(sorted(nums)),
        }
    if kind == 10:
        nums = [rng.randint(0, 99) for _ in range(rng.randint(3, 6))]
        return {"instruction": "Which number is the largest?", "input": _fmt_list(nums), "output": str(max(nums))}
    if kind == 11:
        a = rng.randint(1, 999)
        return {"instruction": f"Is {a} even or odd?", "input": "", "output": "even" if a % 2 == 0 else "odd"}
    if kind == 12:
        p = rng.choice(_PHRASES)
        return {"instruction": "Count the words in the input.", "input": p, "output": str(len(p.split()))}
    q, a = rng.choice(_KEYWORDS)
    return {"instruction": q, "input": "", "output": a}


def instruction_set(n: int = 400, seed: int = 0) -> list[dict]:
    """`n` Alpaca-shaped records {"instruction", "input", "output"} of simple tasks with computed answers, e.g.
    "Add 23 and 58." -> "81", "Reverse the word: python" -> "nohtyp", "Uppercase: hello world" -> "HELLO WORLD",
    "Count the letters in: banana" -> "6". Deterministic for a seed; duplicates are avoided while the task space
    allows it."""
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = random.Random(seed)
    out: list[dict] = []
    seen: set[tuple[str, str]] = set()
    attempts = 0
    while len(out) < n:
        rec = _task(rng)
        key = (rec["instruction"], rec["input"])
        attempts += 1
        if key in seen and attempts < 50 * n:
            continue
        seen.add(key)
        out.append(rec)
    return out


def write_demo_files(directory) -> dict[str, Path]:
    """Write the demo data into `directory` (created if needed) and return their paths:
    {"pretrain": pretrain.txt, "heldout_code": heldout_code.txt, "instructions": instructions.jsonl (400 rows),
    "instructions_eval": instructions_eval.jsonl (50 rows, none of them in the train file)}."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pretrain, heldout = stdlib_corpus()
    records = instruction_set(450, seed=0)
    train, evals = records[:400], records[400:]
    train_keys = {(r["instruction"], r["input"]) for r in train}
    evals = [r for r in evals if (r["instruction"], r["input"]) not in train_keys]
    paths = {
        "pretrain": directory / "pretrain.txt",
        "heldout_code": directory / "heldout_code.txt",
        "instructions": directory / "instructions.jsonl",
        "instructions_eval": directory / "instructions_eval.jsonl",
    }
    paths["pretrain"].write_text(pretrain, encoding="utf-8")
    paths["heldout_code"].write_text(heldout, encoding="utf-8")
    for key, rows in (("instructions", train), ("instructions_eval", evals)):
        with paths[key].open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return paths
