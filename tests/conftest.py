"""Shared fixtures: tiny models and tokenizers built locally (no hub access), small data files."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # the only place: every test and every subprocess it starts is offline
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import atexit
import shutil
import tempfile

# datasets caches what it reads (Arrow copies, map results): keep the tests' copies out of the user's cache.
if "HF_DATASETS_CACHE" not in os.environ:
    os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="posttrainllm-tests-datasets-")
    atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], True)

from pathlib import Path

import pytest
from harness import cli_args, free_port, run_args, torchrun, torchrun_cmd  # noqa: F401  the run harness, shared

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

CORPUS = [
    "the quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n    return a + b\n",
    "Instruction: add two numbers. Response: the sum is 42.",
    "hello world, this is a tiny corpus for a tiny tokenizer.",
]


def build_tokenizer(texts=CORPUS, vocab_size=320, specials=None, **tokens):
    """The tests' one tokenizer builder: a byte-level BPE trained here on `texts`. Without `specials`, exactly what
    `pretrain` trains (models.train_bpe_tokenizer); with them, a plain one whose special tokens are `specials` and
    whose roles (eos_token=..., pad_token=..., model_max_length=...) are `tokens`."""
    if specials is None:
        from posttrainllm.models import train_bpe_tokenizer

        return train_bpe_tokenizer(texts * 20, vocab_size)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts) * 20, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **tokens)


def build_tiny_model(tokenizer, n_layers=4, hidden=32, model_type="llama", **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        **{"tie_word_embeddings": False, "max_position_embeddings": 256, **extra},
    )
    return AutoModelForCausalLM.from_config(cfg)


@pytest.fixture
def tokenizer():
    """The data tests' tokenizer (tests/data_samples.py); test modules that need another one define their own."""
    from data_samples import make_tokenizer

    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 4-block llama-style model with a byte-level BPE tokenizer, saved in HF format."""
    import torch

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-llama")
    tok = build_tokenizer()
    model = build_tiny_model(tok)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def teacher_model_dir(tmp_path_factory, tiny_model_dir):
    """distill's teacher: a 6-block model with tiny_model_dir's tokenizer (so the same vocabulary), other weights."""
    import torch
    from transformers import AutoTokenizer

    torch.manual_seed(1)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    d = tmp_path_factory.mktemp("teacher")
    build_tiny_model(tok, n_layers=6).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def check_optimizer_groups(optimizer, model, lr, gamma, *, not_in=()):
    """The trainer's optimizer follows the formula: block i at lr × γ^(N-1-i), the embeddings at block 0's LR, the
    head at lr; it holds every trainable weight of `model` exactly once, and no weight of the models in `not_in` (a
    reference model, a teacher). Returns the groups by name."""
    groups = {g["name"]: g for g in optimizer.param_groups}
    n = model.config.num_hidden_layers
    for i in range(n):
        assert groups[f"block_{i}"]["lr"] == pytest.approx(lr * gamma ** (n - 1 - i)), i
    assert groups["embeddings"]["lr"] == pytest.approx(lr * gamma ** (n - 1))
    assert groups["head"]["lr"] == pytest.approx(lr)
    in_optimizer = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert sorted(in_optimizer) == sorted(id(p) for p in model.parameters() if p.requires_grad)
    for other in not_in:
        assert not {id(p) for p in other.parameters()} & set(in_optimizer)
    return groups


def saved_groups(out):
    """param_groups.json of a run: each group's name, lr, weight decay and parameter names (wrapper prefixes
    stripped)."""
    from posttrainllm.llrd import strip_wrappers

    return [
        {
            "name": g["name"],
            "lr": g["lr"],
            "weight_decay": g["weight_decay"],
            "params": [strip_wrappers(n) for n in g["params"]],
        }
        for g in json.loads((Path(out) / "param_groups.json").read_text())
    ]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def alpaca_file(tmp_path):
    rows = [
        {"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"The sum is {2 * i + 1}."} for i in range(32)
    ]
    p = tmp_path / "alpaca.json"
    p.write_text(json.dumps(rows))
    return p


@pytest.fixture
def captured_trainer(monkeypatch):
    """The trainers whose create_optimizer ran in this test, in order (the LLRD hook, spied on)."""
    from posttrainllm.training import LLRDMixin

    seen = []
    original = LLRDMixin.create_optimizer

    def spy(self, model=None):
        seen.append(self)
        return original(self, model)

    monkeypatch.setattr(LLRDMixin, "create_optimizer", spy)
    return seen


@pytest.fixture
def preference_file(tmp_path):
    rows = [{"prompt": f"Say {i}.", "chosen": f"{i}", "rejected": f"no {i + 3} maybe"} for i in range(32)]
    return write_jsonl(tmp_path / "prefs.jsonl", rows)


@pytest.fixture
def unpaired_file(tmp_path):
    """KTO's unpaired preference data: 16 desirable and 16 undesirable completions."""
    rows = [
        {"prompt": f"Say {i}.", "completion": f"{i}" if i % 2 == 0 else f"no {i + 3} maybe", "label": i % 2 == 0}
        for i in range(32)
    ]
    return write_jsonl(tmp_path / "kto.jsonl", rows)


@pytest.fixture
def prompts_file(tmp_path):
    """grpo / rloo prompt data: a prompt and a verifiable answer per row (in `answer` and, as DeepMath names it,
    `solution`)."""
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "solution": str(i + 1)} for i in range(16)]
    return write_jsonl(tmp_path / "prompts.jsonl", rows)


@pytest.fixture
def ood_file(tmp_path):
    """A held-out text for the sweep tests: code and prose."""
    p = tmp_path / "ood.txt"
    p.write_text("def add(a, b):\n    return a + b\n" * 40 + "the lazy dog sleeps in the sun. " * 60)
    return p


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text("\n".join(CORPUS * 40))
    return p


# ------------------------------------------------------------------------ the layout: tests/e2e is the smoke set
E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(items):
    """Every test under tests/e2e trains a tiny model or launches processes: it is marked `smoke`, so that
    `-m "not slow and not smoke"` is the fast set (tests/unit and tests/cli less their marked tests)."""
    for item in items:
        if E2E in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.smoke)


# ------------------------------------------------------------------------ the suite leaves the checkout as it was
REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent  # on sys.path (pyproject: pythonpath), so every folder imports conftest
_NOT_OURS = {".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
_BENCH_OUTPUT = {"bench/out", "studies/out"}  # where benchmarks and studies write (ignored by git), never a test


def checkout_listing(root: Path = REPO) -> set[str]:
    """Every file and directory of the checkout (relative paths), the environment and caches excepted."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = [
            d
            for d in dirnames
            if d not in _NOT_OURS and not d.endswith(".egg-info") and (rel / d).as_posix() not in _BENCH_OUTPUT
        ]
        found |= {(rel / n).as_posix() for n in dirnames + filenames}
    return found


@pytest.fixture(scope="session", autouse=True)
def _the_suite_leaves_no_files_in_the_checkout():
    """Tests write under tmp_path only: anything new in the checkout after the session is an error."""
    before = checkout_listing()
    yield
    new = sorted(checkout_listing() - before)
    assert not new, f"the tests left files in the checkout: {new[:10]}" + (
        f" (+{len(new) - 10})" if len(new) > 10 else ""
    )
