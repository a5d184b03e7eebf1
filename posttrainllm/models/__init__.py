"""Loading models and tokenizers (local dirs or hub ids), from-scratch presets, tokenizer training, precision."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrainllm.constants import LAYER_COUNT_KEYS
from posttrainllm.errors import ModelError, UsageError, one_line
from posttrainllm.models.template_guard import check_tokenizer_templates

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
)

# From-scratch presets for `pretrain` (llama-style decoder). `--model-config` also takes a config.json path.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=64, intermediate_size=176, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
    ),
    "small": dict(
        hidden_size=64, intermediate_size=176, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2
    ),  # the study's base
    "base": dict(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=4
    ),
}


def hub_offline() -> bool:
    return any(
        os.environ.get(k, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds a model config for `repo_id` (what an offline load needs)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return any(
            isinstance(try_to_load_from_cache(repo_id, name), str) for name in ("config.json", "adapter_config.json")
        )
    except Exception:  # noqa: BLE001 - an invalid repo id is simply not in the cache
        return False


def check_model_ref(ref: str, what: str = "--model", hint: Callable[[], str | None] | None = None) -> None:
    """Fail early (exit 2) on a local model directory that cannot be a model, and on a hub id that cannot load
    because the Hub is offline and the cache does not hold it (`hint()` may add which recipe produces it); other
    hub problems are reported when loading."""
    p = Path(ref).expanduser()
    if not p.exists():
        if hub_offline() and not in_hub_cache(ref):
            extra = hint() if hint else None
            raise UsageError(
                f"{what} {ref}: not a local directory and the Hub is offline (HF_HUB_OFFLINE=1)"
                + (f"; {extra}" if extra else "")
            )
        return
    if not p.is_dir():
        raise UsageError(
            f"{what} {ref} is a file; pass the model directory (with config.json and weights), a .gguf file or a hub id"
        )
    if not (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():
        raise UsageError(f"{what} {ref} has no config.json: not a Hugging Face model directory")
    if not any((p / f).is_file() for f in WEIGHT_FILES) and not list(p.glob("*.safetensors")):
        raise UsageError(f"{what} {ref} has no weights (model.safetensors / pytorch_model.bin)")


def resolve_model(
    ref: str, what: str = "--model", hint: Callable[[], str | None] | None = None, trust_remote_code: bool = False
) -> tuple[str, dict[str, Any] | None]:
    """What to load for `ref`: the model directory or hub id itself (checked by check_model_ref), or, for a GGUF
    file (or a directory holding one), the directory it is converted into once (posttrainllm/models/gguf.py), with what
    the file holds (architecture, quantization) as the second value."""
    from posttrainllm.models import gguf

    path = gguf.find_gguf(ref, what)
    if path is None:
        check_model_ref(ref, what, hint)
        return ref, None
    info = gguf.cached_inspect(path) or gguf.inspect(path, what)  # a converted file's header is not read again
    return str(gguf.convert(path, info, trust_remote_code=trust_remote_code)), info


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX): without them torch emulates bf16 matmuls,
    measured 0.3 GFLOPS against fp32's 50 on an AVX2 CPU (docs/performance.md)."""
    import torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    try:
        return any(bool(getattr(torch.cpu, name)()) for name in checks if hasattr(torch.cpu, name))
    except Exception:  # noqa: BLE001 - an unknown CPU: assume no native support
        return False


def pick_precision(requested: str = "auto") -> str:
    """auto → bf16 on a GPU that supports it, fp16 on other GPUs; on a CPU, bf16 autocast over fp32 weights where
    the CPU has bf16 instructions (AVX512-BF16 or AMX), else fp32 (decision log 37). fp16 needs a GPU."""
    import torch

    if requested != "auto":
        if requested == "fp16" and not torch.cuda.is_available():
            raise UsageError("--precision fp16 needs a GPU; on CPU use fp32 (or bf16 where the CPU supports it)")
        return requested
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_has_native_bf16() else "fp32"


def precision_reason(requested: str, picked: str) -> str:
    """Why the run uses `picked` (the banner's precision row)."""
    import torch

    on_gpu = torch.cuda.is_available()
    if requested != "auto":
        if picked == "bf16" and not on_gpu:
            native = "native bf16 on this CPU" if cpu_has_native_bf16() else "this CPU has NO native bf16: slow"
            return f"asked for: bf16 autocast, fp32 weights; {native}"
        return "asked for"
    if on_gpu:
        return "auto: the GPU supports bf16" if picked == "bf16" else "auto: the GPU has no bf16"
    if picked == "bf16":
        return "auto: this CPU has bf16 instructions; autocast, fp32 weights; --precision fp32 for full precision"
    return "auto: this CPU has no bf16 instructions (AVX512-BF16/AMX)"


def precision_notes(picked: str) -> list[str]:
    """A warning when bf16 was asked for on a CPU without bf16 instructions."""
    import torch

    if picked != "bf16" or torch.cuda.is_available() or cpu_has_native_bf16():
        return []
    return [
        "--precision bf16 on a CPU without bf16 instructions (AVX512-BF16/AMX): torch emulates bf16 matmuls, "
        "which was over 100x slower than fp32 on such a CPU (docs/performance.md); use --precision fp32"
    ]


def _template_owner(ref: str) -> str:
    """The model a chat template comes from, for messages: a converted GGUF's own file, else the reference."""
    from posttrainllm.models import gguf

    source = gguf.read_source(ref) if os.path.isdir(ref) else None
    return f"{source['file']} (tokenizer.chat_template)" if source and source.get("file") else ref


def load_tokenizer(
    ref: str, trust_remote_code: bool = False, *, need_eos: bool = False, notes: list[str] | None = None
):
    """The tokenizer, with a pad token (its EOS, or a new <|pad|>). need_eos (sft/dpo, which end every completion
    with EOS): a tokenizer without one gets a new <|endoftext|> token, and `notes` says so."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(ref, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"cannot load a tokenizer from {ref}: {one_line(e)}") from e
    check_tokenizer_templates(tok, _template_owner(ref))
    if need_eos and tok.eos_token is None:
        before = len(tok)
        tok.add_special_tokens({"eos_token": "<|endoftext|>"})
        if notes is not None:
            row = " (a new embedding row)" if len(tok) > before else ""
            notes.append(f"the tokenizer has no EOS token: using <|endoftext|>{row} as EOS so that completions can end")
    _give_pad_token(tok)
    return tok


def _give_pad_token(tok) -> None:
    """A tokenizer without a pad token pads with its EOS token, else with a new <|pad|> token."""
    if tok.pad_token is None:
        if tok.eos_token is not None:
            tok.pad_token = tok.eos_token
        else:
            tok.add_special_tokens({"pad_token": "<|pad|>"})


def load_processor(ref: str, trust_remote_code: bool = False, *, need_eos: bool = False):
    """A vision-language model's processor (AutoProcessor: its image processor, tokenizer and chat template), its
    tokenizer given a pad token as `load_tokenizer` does; one-line errors."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(ref, trust_remote_code=trust_remote_code)
    except ImportError as e:
        if (missing := missing_backends(e)) is not None:
            name, packages = missing
            raise ModelError(
                f"cannot load the processor of {ref}: its {name} needs {' and '.join(packages)}, which is not "
                f"installed; install it (pip install {' '.join(packages)}, the build that matches your torch) and "
                "run again"
            ) from e
        raise ModelError(f"cannot load a processor from {ref}: {one_line(e)}") from e
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"cannot load a processor from {ref}: {one_line(e)}") from e
    tok = getattr(processor, "tokenizer", None)
    if tok is None:
        raise ModelError(f"the processor of {ref} ({type(processor).__name__}) has no tokenizer")
    check_tokenizer_templates(processor, _template_owner(ref))
    if need_eos and tok.eos_token is None:
        raise ModelError(f"the tokenizer of {ref} has no EOS token: completions could not end; set eos_token")
    _give_pad_token(tok)
    return processor


# transformers' backend names whose package is named otherwise
_PACKAGES = {"vision": "Pillow", "cv2": "opencv-python", "sklearn": "scikit-learn", "torchaudio": "torchaudio"}


def missing_backends(error: ImportError) -> tuple[str, list[str]] | None:
    """The class and the packages an ImportError of transformers' `requires_backends` is about (a processor part
    whose optional dependency is not installed, e.g. Qwen2-VL's video processor without torchvision), read from the
    traceback's `requires_backends` frame (its `obj` and `backends`), not from the message; None for another one."""
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "requires_backends" and "backends" in frame.f_locals:
            backends = frame.f_locals["backends"]
            from transformers.utils.import_utils import BACKENDS_MAPPING

            names = [b for b in (backends if isinstance(backends, (list, tuple)) else [backends]) if isinstance(b, str)]
            names = [b for b in names if b in BACKENDS_MAPPING and not BACKENDS_MAPPING[b][0]()] or names
            obj = frame.f_locals.get("obj")
            name = getattr(obj, "__name__", None) or type(obj).__name__
            if names:
                return name, [_PACKAGES.get(b, b) for b in names]
        tb = tb.tb_next
    return None


def text_tokenizer(tokenizer_or_processor):
    """The tokenizer itself: a processor's `tokenizer`, or the argument when it is one."""
    return getattr(tokenizer_or_processor, "tokenizer", None) or tokenizer_or_processor


# --model-arg keys that a first-class option owns, and the from_pretrained keywords that make no sense here
_MODEL_ARG_OWNER = {"trust_remote_code": "--trust-remote-code", "pretrained_model_name_or_path": "--model"}
_LOAD_KWARGS = {
    "attn_implementation",
    "cache_dir",
    "device_map",
    "dtype",
    "experts_implementation",
    "force_download",
    "gguf_file",
    "ignore_mismatched_sizes",
    "key_mapping",
    "local_files_only",
    "low_cpu_mem_usage",
    "max_memory",
    "offload_buffers",
    "offload_folder",
    "quantization_config",
    "revision",
    "subfolder",
    "token",
    "use_kernels",
    "use_safetensors",
    "variant",
    "weights_only",
    "disable_mmap",
}


def check_model_args(ref: str, raw: dict[str, Any], trust_remote_code: bool = False) -> dict[str, Any]:
    """--model-arg KEY=VALUE: a from_pretrained keyword or a field of the model's config (from_pretrained passes
    those on to the config); anything else is a UsageError naming the closest keys. `torch_dtype` means `dtype`.
    The same check as --trainer-arg's (config.coerce.check_keyed); the values have no declared type, so they are
    read as YAML reads them."""
    from posttrainllm.config.coerce import check_keyed  # not at import: config/ is more than a model load needs
    from posttrainllm.errors import ConfigErrors

    if not raw:
        return {}
    config_keys: set[str] = set()
    try:
        from transformers import AutoConfig

        config_keys = set(AutoConfig.from_pretrained(ref, trust_remote_code=trust_remote_code).to_dict())
    except Exception:  # noqa: BLE001 - the model load reports an unreadable config
        pass
    out = check_keyed(
        "--model-arg", raw, dict.fromkeys(sorted(_LOAD_KWARGS | config_keys), Any), owned=_MODEL_ARG_OWNER,
        unknown=f"not a from_pretrained argument nor a config field of {ref}", aliases={"torch_dtype": "dtype"},
    )  # fmt: skip
    if isinstance(out.get("dtype"), str) and out["dtype"] != "auto":
        import torch

        if not isinstance(getattr(torch, out["dtype"], None), torch.dtype):
            raise ConfigErrors(
                [f"--model-arg dtype={out['dtype']}: not a torch dtype (e.g. bfloat16, float16, float32, auto)"]
            )
    return out


def load_model(
    ref: str,
    *,
    trust_remote_code: bool = False,
    precision: str = "fp32",
    what: str = "--model",
    model_args: dict | None = None,
    fine_tune: bool = False,
    allow_new_weights: bool = False,
    notes: list[str] | None = None,
    reward_head: bool = False,
):
    """AutoModelForCausalLM.from_pretrained for a local dir or hub id (AutoModelForImageTextToText for a
    vision-language model: posttrainllm/vision/detect.py); safetensors preferred; one-line errors.
    `reward_head`: AutoModelForSequenceClassification with one output (a reward model): its score head is new, and
    the checkpoint's LM head goes unused, which the notes say (any other mismatch is reported as usual).
    `model_args` (checked by check_model_args) are passed on to from_pretrained. The config is checked against
    the safetensors headers first (posttrainllm/models/weights.py: an absurd block count is refused, and for a model to
    `fine_tune` any block count the weights do not hold); for a model to `fine_tune`, missing or unused weights
    are a ModelError unless `allow_new_weights` (then `notes` name them)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSequenceClassification

    from posttrainllm.models import weights
    from posttrainllm.vision.detect import is_vlm

    check_model_ref(ref, what)
    weights.check_config(ref, allow_new_weights=allow_new_weights or not fine_tune, what=what)
    # fp16: AMP on fp32 weights; bf16: bf16 weights on a GPU, autocast over fp32 weights on a CPU (decision log 36)
    bf16 = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    dtype = {"fp32": torch.float32, "bf16": bf16, "fp16": torch.float32}[precision]
    kwargs = {"dtype": dtype, **(model_args or {})}
    if reward_head:
        auto = AutoModelForSequenceClassification
    else:
        auto = AutoModelForImageTextToText if is_vlm(ref, trust_remote_code) else AutoModelForCausalLM
    if reward_head:
        kwargs["num_labels"] = 1
    try:
        model, info = auto.from_pretrained(ref, trust_remote_code=trust_remote_code, output_loading_info=True, **kwargs)
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise UsageError(f"{ref} contains custom code; re-run with --trust-remote-code if you trust it") from e
        raise ModelError(f"cannot load model {ref}: {one_line(e)}") from e
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"cannot load model {ref}: {one_line(e)}") from e
    if fine_tune and not (Path(ref).expanduser() / "adapter_config.json").is_file():  # an adapter: the base is absent
        if reward_head:
            info, head_notes = weights.reward_head_keys(model, info)
            if notes is not None:
                notes.extend(head_notes)
        found = weights.check_loaded(ref, info, allow_new_weights=allow_new_weights, what=what)
        if notes is not None:
            notes.extend(found)
    return model


def _config_int(ref: str, trust_remote_code: bool, keys: tuple[str, ...]) -> int | None:
    """The first positive integer among `keys` in the model's (text) config, read without the weights; None when
    the config cannot be read (the model load that follows reports the real problem) or says none of them."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(ref, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - the model load that follows reports the real problem
        return None
    config = getattr(config, "text_config", None) or config
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def max_positions(ref: str, trust_remote_code: bool = False) -> int | None:
    """The longest sequence the model's config allows (learned position embeddings fail past it), if it says."""
    return _config_int(ref, trust_remote_code, POSITION_KEYS)


def vocab_size(ref: str, trust_remote_code: bool = False) -> int | None:
    return _config_int(ref, trust_remote_code, ("vocab_size",))


def num_layers(ref: str, trust_remote_code: bool = False) -> int | None:
    """The config's block count (`num_hidden_layers`, `n_layer`, ...), if it says."""
    return _config_int(ref, trust_remote_code, LAYER_COUNT_KEYS)


def fit_embeddings_to_tokenizer(model, tokenizer) -> None:
    """Grow the embedding matrix when the tokenizer has more tokens (e.g. an added pad token)."""
    tokenizer = text_tokenizer(tokenizer)
    try:
        rows = model.get_input_embeddings().weight.shape[0]
    except (NotImplementedError, AttributeError):
        return
    if len(tokenizer) > rows:
        model.resize_token_embeddings(len(tokenizer))


# -------------------------------------------------------------------------------------------------------- pretrain
def check_model_config(spec: str) -> None:
    """--model-config must be a preset name or an existing config.json (checked before the tokenizer is trained)."""
    if spec not in PRESETS and not Path(spec).expanduser().is_file():
        raise UsageError(f"--model-config {spec}: not a preset ({', '.join(PRESETS)}) and no such config.json file")


def scratch_config(spec: str, vocab_size: int, max_length: int, tokenizer):
    """A from-scratch config: a preset name (llama-style) or a path to a config.json of any causal-LM architecture."""
    from transformers import AutoConfig, LlamaConfig

    special = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    check_model_config(spec)
    if spec in PRESETS:
        return LlamaConfig(
            vocab_size=vocab_size,
            max_position_embeddings=max(max_length, 256),
            tie_word_embeddings=False,
            **PRESETS[spec],
            **special,
        )
    p = Path(spec).expanduser()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        model_type = data.pop("model_type")
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(
            f"--model-config {spec}: not a readable config.json with a model_type ({one_line(e)})"
        ) from None
    data.update(vocab_size=vocab_size, **{k: v for k, v in special.items() if v is not None})
    return AutoConfig.for_model(model_type, **data)


def train_bpe_tokenizer(texts, vocab_size: int):
    """A byte-level BPE tokenizer trained on the corpus (tokenizers library), wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token=None,
        pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=1_000_000,
    )
