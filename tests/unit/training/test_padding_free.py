"""sft's padding-free batches (posttrainllm/training/padding_free.py): for every architecture the decision calls
exact, TRL's padding-free batch gives each token the loss the padded batch gives it (sdpa and eager, sliding-window
layers included), while an attention mask of ones on the same row does not; what is not verified stays padded."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from families import DECODER

from posttrainllm.training.padding_free import EXACT_ATTENTION, VERIFIED, padded_because

HEAD = {"head_dim": 8}
SLIDING = {"sliding_window": 4}
CONFIGS = {
    "mistral": SLIDING,
    "mixtral": {"num_local_experts": 2, "num_experts_per_tok": 1, **SLIDING},
    "qwen2_moe": {
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 16,
    },
    "qwen3": HEAD,
    "qwen3_moe": {**HEAD, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16},
    "gemma": HEAD,
    "gemma2": {**HEAD, **SLIDING},
    "gemma3_text": {**HEAD, **SLIDING, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
}
NO_SDPA = {"gemma2"}  # transformers refuses sdpa for it: eager only
CASES = [(kind, attn) for kind in sorted(VERIFIED) for attn in EXACT_ATTENTION if (kind, attn) != ("gemma2", "sdpa")]


def _model(kind: str, attn: str = "sdpa", **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(kind, **{**DECODER, **CONFIGS.get(kind, {}), **extra})
    cfg._attn_implementation = attn
    return AutoModelForCausalLM.from_config(cfg).eval()


def _examples():
    """Three examples of different lengths, each with a 3-token prompt that carries no loss."""
    g = torch.Generator().manual_seed(3)
    rows = []
    for n in (9, 6, 12):
        ids = torch.randint(3, 100, (n,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
    return rows


def _per_token(model, batch, **override):
    """Per-token losses of `batch` (labels shifted as the LM loss shifts them), one tensor per example."""
    inputs = {k: v for k, v in {**batch, **override}.items() if k != "labels"}
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits.float()
    labels = batch["labels"]
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], reduction="none", ignore_index=-100)
    return losses, labels[:, 1:] != -100


@pytest.mark.parametrize(("kind", "attn"), CASES)
def test_padding_free_gives_every_token_its_padded_loss(kind, attn):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    model = _model(kind, attn)
    assert padded_because(model) is None
    rows = _examples()
    padded = DataCollatorForLanguageModeling(pad_token_id=0)(rows)
    free = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
    assert "attention_mask" not in free and free["input_ids"].shape == (1, 27)
    want, want_mask = _per_token(model, padded)
    got, got_mask = _per_token(model, free)
    want, got = want[want_mask], got[got_mask]
    assert want.shape == got.shape == (18,)  # the same loss tokens: 6 + 3 + 9 (each example past its prompt)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert abs(got.mean() - want.mean()) < 1e-6  # the mean over the same tokens: the trainers' loss
    # the control: the same row with an attention mask of ones attends across the examples
    crossed, _ = _per_token(model, free, attention_mask=torch.ones_like(free["input_ids"]))
    assert (crossed[got_mask][6:] - want[6:]).abs().max() > 1e-4


def test_an_unverified_architecture_is_not_exact_and_stays_padded():
    """OPT's learned positions are not those of the padded run: padding-free would change its loss."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    kw = dict(vocab_size=100, hidden_size=16, ffn_dim=32, num_hidden_layers=2, num_attention_heads=2)
    model = _model("opt", word_embed_proj_dim=16, **kw)
    rows = _examples()
    want, want_mask = _per_token(model, DataCollatorForLanguageModeling(pad_token_id=0)(rows))
    got, got_mask = _per_token(model, DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows))
    assert (got[got_mask] - want[want_mask]).abs().max() > 1e-4
    assert "OPTForCausalLM (opt) is not an architecture whose padding-free loss is verified" in padded_because(model)


@pytest.mark.parametrize("attn", ["flash_attention_2", "flex_attention"])
def test_an_attention_kind_not_verified_keeps_padding(attn):
    model = _model("llama")
    model.config._attn_implementation = attn
    assert padded_because(model) == (
        f"its attention ({attn}) is not verified to keep the examples of one row apart (sdpa and eager are)"
    )


def test_remote_code_and_vision_models_keep_padding():
    from transformers import LlamaForCausalLM

    class Custom(LlamaForCausalLM):  # a repository's own class on a llama config
        pass

    model = _model("llama")
    custom = Custom(model.config)
    assert padded_because(custom) == "Custom is the model repository's own code, not transformers' llama (not verified)"
    model.config.vision_config = {"hidden_size": 8}
    assert padded_because(model) == "a vision-language model (TRL's padding-free batches take no images)"


def test_the_decision_sees_through_a_lora_wrapper():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_model("qwen2"), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert padded_because(model) is None
    model.get_base_model().config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in padded_because(model)


def test_the_layout_costs_count_each_layers_matrices_the_head_and_the_attention_pairs():
    from types import SimpleNamespace

    from posttrainllm.training.padding_free import PAIR_COST, layout_costs

    cfg = SimpleNamespace(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, head_dim=16, num_key_value_heads=2,
        intermediate_size=128, vocab_size=1000,
    )  # fmt: skip
    per_token, per_pair = layout_costs(cfg)
    # q and o: 64 × 64 each; k and v: 64 × 32 each; the gated MLP: 3 × 64 × 128; the head: 64 × 1000
    assert per_token == 2 * (3 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 64 * 1000)
    assert per_pair == 2 * 2 * 4 * 16 * 3 * PAIR_COST  # q·k and weights·v of 4 heads of 16 over 3 layers


def test_a_batch_is_flattened_only_where_that_computes_less():
    from posttrainllm.training.padding_free import CheaperLayout

    class Collator:
        padding_free, pad_token_id = None, 7

        def __call__(self, examples):
            return {"padding_free": self.padding_free, "n": len(examples)}

    layout = CheaperLayout(Collator(), per_token=1000.0, per_pair=1.0)
    rows = lambda *lengths: [{"input_ids": [1] * n} for n in lengths]  # noqa: E731
    # ragged short rows: 8 rows of 10 and one of 100 flatten to 170 positions (1000·170 + 170² = 198,900) where the
    # padded batch holds 9 × 100 (1000·900 + 9·100² = 990,000)
    assert layout(rows(*[10] * 8, 100)) == {"padding_free": True, "n": 9}
    # long even rows: 8 × 1000 flattened cost 1000·8000 + 8000² = 7.2e7, padded 1000·8000 + 8·1000² = 1.6e7
    assert layout(rows(*[1000] * 8)) == {"padding_free": False, "n": 8}
    assert (layout.flattened, layout.padded) == (1, 1) and layout.pad_token_id == 7
    # the break-even, in closed form: one row of n is never dearer than itself padded
    assert layout.flatten([5]) and layout.flatten([3, 3]) is (1000 * 6 + 36 <= 1000 * 6 + 2 * 9)


class _PicklableCollator:
    padding_free, pad_token_id = None, 3

    def __call__(self, examples):
        return {"padding_free": self.padding_free}


def test_the_layout_wrapper_survives_pickle_and_copy_as_dataloader_workers_take_it():
    import copy
    import pickle

    from posttrainllm.training.padding_free import CheaperLayout

    layout = CheaperLayout(_PicklableCollator(), per_token=1000.0, per_pair=1.0)
    for again in (pickle.loads(pickle.dumps(layout)), copy.copy(layout), copy.deepcopy(layout)):
        assert again.pad_token_id == 3 and (again.per_token, again.per_pair) == (1000.0, 1.0)
        assert again([{"input_ids": [1] * 10}] * 8 + [{"input_ids": [1] * 100}]) == {"padding_free": True}
