"""What `posttrainllm merge` reads: the two models as local directories (a GGUF file converted once, a hub id from
the cache), a LoRA adapter as the tuned model, and the checks made before any weight is read (architecture, tensor
names and shapes from the safetensors headers, tokenizers). Imports transformers/peft only where it loads."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from posttrainllm.constants import LAYER_COUNT_KEYS
from posttrainllm.errors import ModelError, UsageError, one_line, shorten

ADAPTER_CONFIG = "adapter_config.json"
# the files of a model directory that the merged one takes over (besides the weights)
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]


@dataclass
class Source:
    """One side of the merge: the reference as given, the local model directory read, and how it was found."""

    ref: str
    path: Path  # the model directory (for a LoRA adapter: the adapter directory)
    kind: str  # "directory", "gguf", "hub" or "lora"
    gguf: dict | None = None
    config: dict = field(default_factory=dict)

    @property
    def is_adapter(self) -> bool:
        return self.kind == "lora"


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{what}: cannot read {path} ({one_line(e)})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{what}: {path} is not a JSON object")
    return data


def resolve_source(ref: str, what: str, *, adapter_ok: bool, trust_remote_code: bool = False) -> Source:
    """`ref` as a local directory with safetensors weights (a UsageError, exit 2, when it cannot be one)."""
    from posttrainllm import models

    p = Path(ref).expanduser()
    if p.is_dir() and (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file():
        if not adapter_ok:
            raise UsageError(f"{what} {ref} is a LoRA adapter: pass the full base model (the adapter goes in --model)")
        return Source(ref, p, "lora", config=_read_json(p / ADAPTER_CONFIG, what))
    path, gguf_info = models.resolve_model(ref, what, trust_remote_code=trust_remote_code)
    kind = "gguf" if gguf_info is not None else "directory"
    local = Path(path).expanduser()
    if not local.exists():  # a hub id, checked by resolve_model: its files from the cache (or the Hub)
        local, kind = _hub_snapshot(ref, what), "hub"
    if not any((local / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")):
        raise UsageError(
            f"{what} {ref} has no safetensors weights (model.safetensors): merge streams safetensors; re-save the "
            "model with save_pretrained (safetensors is its default)"
        )
    return Source(ref, local, kind, gguf_info, _read_json(local / "config.json", what))


def _hub_snapshot(ref: str, what: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(ref, allow_patterns=_HUB_PATTERNS))
    except Exception as e:  # noqa: BLE001 - offline and not cached, no such repo, network
        raise UsageError(f"{what} {ref}: cannot get its files from the Hub ({one_line(e)})") from None


def config_int(config: dict, keys) -> int | None:
    """The first integer among `keys` in a config.json's text section, else in the config itself."""
    for section in (config.get("text_config"), config):
        if isinstance(section, dict):
            for key in keys:
                if isinstance(section.get(key), int):
                    return section[key]
    return None


def num_blocks(config: dict) -> int | None:
    return config_int(config, LAYER_COUNT_KEYS)


def check_architectures(base: Source, tuned: Source) -> None:
    """The two configs name the same model type and architecture (for an adapter: its recorded base's type, when
    the adapter says); else a UsageError naming both."""
    if tuned.is_adapter:
        recorded = Path(str(tuned.config.get("base_model_name_or_path") or "")).expanduser()
        if not (recorded / "config.json").is_file():
            return  # a hub id or a moved directory: peft reports a mismatch when it merges
        other = _read_json(recorded / "config.json", "--model")
        if other.get("model_type") != base.config.get("model_type"):
            raise UsageError(
                f"--model {shorten(tuned.ref)} is a LoRA adapter of a {other.get('model_type')} model ({recorded}), "
                f"--base {shorten(base.ref)} is {base.config.get('model_type')}: pass the adapter's own base"
            )
        return
    for key in ("model_type", "architectures"):
        b, t = base.config.get(key), tuned.config.get(key)
        if b != t:
            raise UsageError(
                f"--base {shorten(base.ref)} and --model {shorten(tuned.ref)} are different architectures ({key}: "
                f"{b} and {t}): a merge interpolates the same weights of one architecture"
            )


def _inside(path: Path, root: Path) -> bool:
    p, r = os.path.realpath(path), os.path.realpath(root)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


def check_output_dir(out: str, sources: list[tuple[str, Source]]) -> None:
    """The output directory is neither an input nor inside one, and holds no input (a UsageError otherwise)."""
    o = Path(out).expanduser()
    for flag, src in sources:
        for where in {src.path, Path(src.ref).expanduser()}:
            if not where.is_dir():
                continue
            if _inside(o, where):
                raise UsageError(
                    f"--output-dir {shorten(out)} is {flag} {shorten(src.ref)} or inside it: a merge never writes "
                    "into its inputs; choose another --output-dir"
                )
            if _inside(where, o):
                raise UsageError(
                    f"{flag} {shorten(src.ref)} is inside --output-dir {shorten(out)}: choose another --output-dir"
                )


def tokenizer_dir(tuned: Source, base: Source) -> Path:
    """Where the merged model's tokenizer comes from: the tuned model's directory (an adapter's, when it saved one,
    else the base's)."""
    if tuned.is_adapter and not any((tuned.path / f).is_file() for f in TOKENIZER_FILES):
        return base.path
    return tuned.path


def check_tokenizers(base_dir: Path, tuned_dir: Path, trust_remote_code: bool = False) -> None:
    """The two tokenizers map the same tokens to the same ids; else a UsageError naming the first difference."""
    if os.path.realpath(base_dir) == os.path.realpath(tuned_dir):
        return
    from transformers import AutoTokenizer

    toks = []
    for flag, d in (("--base", base_dir), ("--model", tuned_dir)):
        try:
            toks.append(AutoTokenizer.from_pretrained(str(d), trust_remote_code=trust_remote_code))
        except Exception as e:  # noqa: BLE001
            raise ModelError(f"cannot load the tokenizer of {flag} {d}: {one_line(e)}") from None
    b = {i: t for t, i in toks[0].get_vocab().items()}
    t = {i: tok for tok, i in toks[1].get_vocab().items()}
    for i in sorted(set(b) | set(t)):
        if b.get(i) != t.get(i):
            raise UsageError(
                f"the tokenizers differ: token id {i} is {b.get(i)!r} in --base and {t.get(i)!r} in --model "
                f"({len(b)} and {len(t)} tokens); a merge needs the tuned model's own base"
            )


def merged_adapter_state(base: Source, adapter: Source, trust_remote_code: bool = False) -> dict:
    """A LoRA adapter merged into the base model (peft ``merge_and_unload``): its state dict, in the base's dtype."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(base.path), dtype="auto", trust_remote_code=trust_remote_code)
        model = PeftModel.from_pretrained(model, str(adapter.path)).merge_and_unload()
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"cannot merge the LoRA adapter {adapter.ref} into {base.ref}: {one_line(e)}") from None
    return {k: v.detach() for k, v in model.state_dict().items()}


def source_record(src: Source) -> dict:
    """What merge.json says about a source: the reference, the directory read, and each weight file's SHA-256
    (the GGUF file's as well for a converted one)."""
    from posttrainllm.rundir.layout import sha256

    names = sorted(
        f.name
        for f in src.path.iterdir()
        if f.is_file() and (f.suffix == ".safetensors" or f.name in ("model.safetensors.index.json", ADAPTER_CONFIG))
    )
    hashes = {n: sha256(src.path / n) for n in names}
    record = {"ref": src.ref, "path": str(src.path), "kind": src.kind, "sha256": hashes}
    if src.gguf is not None:
        from posttrainllm.models import gguf

        record["gguf"] = gguf.read_source(src.path)
    return record


def checkpoint_names(model, stored: list[str]) -> dict[str, str]:
    """Stored tensor name → the model's parameter name, where transformers renames on loading (gpt_neox's
    ``embed_out.weight`` is ``lm_head.weight``; a mixture of experts stores each expert, the model one fused tensor):
    transformers' own conversion mapping (the one PEFT uses), applied to a meta-device `model`. Names it leaves as
    they are are left out; without that API (another transformers), nothing is renamed."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        transforms = get_model_conversion_mapping(model)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        meta = dict(model.state_dict())
        renamed = {k: rename_source_key(k, renamings, converters, model.base_model_prefix, meta)[0] for k in stored}
    except Exception:  # noqa: BLE001 - an API that moved: the names as stored (and the prefix rule of scale_of)
        return {}
    return {k: v for k, v in renamed.items() if v != k}
