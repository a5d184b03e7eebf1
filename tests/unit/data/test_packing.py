"""Packing without cross-attention: TRL's padding-free packing (`--trainer-arg packing=true`, BFD) on CPU with sdpa
gives every packed example the loss it has alone, and the assistant-only loss mask survives packing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from data_samples import make_tokenizer, write_jsonl
from harness import run_args

from posttrainllm import data as D


def _model(vocab: int, attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg).eval()


def _token_losses(logits, ids):
    return F.cross_entropy(logits[:-1].float(), ids[1:], reduction="none")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_packed_batch_gives_each_example_its_unpacked_loss(attn):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    model = _model(100, attn)
    g = torch.Generator().manual_seed(3)
    examples = [torch.randint(3, 100, (n,), generator=g) for n in (9, 6, 12)]
    alone = []
    with torch.no_grad():
        for ids in examples:
            alone.append(_token_losses(model(input_ids=ids[None]).logits[0], ids))
        batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(
            [{"input_ids": ids.tolist()} for ids in examples]
        )
        assert batch["input_ids"].shape == (1, 27) and "attention_mask" not in batch
        # use_cache=False as TRL's SFTTrainer passes it: transformers looks for packed sequences in the position ids
        # only when no KV cache is built (with one, the row would be one causal sequence)
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        # the control: the same row without the position reset attends across the examples
        crossed = model(input_ids=batch["input_ids"], use_cache=False).logits[0]
    start = 0
    for ids, ref in zip(examples, alone):
        seg = slice(start, start + len(ids))
        got = _token_losses(packed[seg], ids)
        assert torch.allclose(got, ref, atol=1e-4), (got - ref).abs().max()
        if start:  # every example after the first would see the ones before it
            assert (_token_losses(crossed[seg], ids) - ref).abs().max() > 1e-3
        start += len(ids)
    # the collator never trains a token on the previous example's last token
    assert (batch["labels"][0][batch["position_ids"][0] == 0] == -100).all()


def test_assistant_only_loss_mask_survives_bfd_packing(tmp_path):
    from test_data_masking import CONVERSATIONS, expected_mask
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    tok = make_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS * 3)), tok)
    loss = D.apply_loss_mask(prep, tok)
    assert loss.assistant_only_loss
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    conf = SFTConfig(
        output_dir=str(tmp_path / "unused"),
        max_length=256,
        report_to=[],
        use_cpu=True,
        bf16=False,
        assistant_only_loss=True,
        packing=True,
        packing_strategy="bfd",
        dataset_num_proc=None,
    )
    trainer = SFTTrainer(model=model, args=conf, train_dataset=prep.train, processing_class=tok)
    wanted = {
        tuple(ids): mask
        for ids, mask in (expected_mask(tok, c["messages"], "<|im_end|>" + tok.eos_token) for c in CONVERSATIONS)
    }
    segments = 0
    for row in trainer.train_dataset:
        batch = trainer.data_collator([row])
        ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
        start = 0
        for n in row["seq_lengths"]:
            seg_ids, seg_labels = tuple(ids[start : start + n]), labels[start : start + n]
            mask = wanted[seg_ids]  # each packed segment is one whole conversation
            for k, (token, label, trained) in enumerate(zip(seg_ids, seg_labels, mask)):
                if k == 0:
                    assert label == -100  # no label across the boundary
                elif trained:
                    assert label == token
                else:
                    assert label == -100
            start += n
            segments += 1
    assert segments == 3 * len(CONVERSATIONS)
    assert len(trainer.train_dataset) < segments  # several conversations share a row


@pytest.mark.smoke
def test_sft_packing_trains_padding_free_rows_and_says_so(captured_trainer, tiny_model_dir, tmp_path):
    import json

    from typer.testing import CliRunner

    from posttrainllm.cli import app

    seen = captured_trainer
    rows = [{"prompt": f"Add {i} and {i + 1}.", "completion": f" {2 * i + 1}."} for i in range(32)]
    data = write_jsonl(tmp_path / "pc.jsonl", rows)  # ~10 tokens a row: several fit in 128
    argv = run_args("sft", tiny_model_dir, data, max_length=128, lr=None, packing=True)  # fmt: skip
    r = CliRunner().invoke(app, argv + ["--output-dir", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "best-fit decreasing" in r.output
    trainer = seen[0]
    assert trainer.args.packing and trainer.args.packing_strategy == "bfd" and trainer.padding_free
    rows = trainer.train_dataset
    assert "seq_lengths" in rows.column_names
    n_examples = sum(len(x) for x in rows["seq_lengths"])
    assert len(rows) < n_examples  # several examples share a row
    assert max(len(x) for x in rows["input_ids"]) <= 128
    batch = trainer.data_collator([rows[0], rows[1]])
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1  # one row, no pad token
    assert int((batch["position_ids"][0] == 0).sum()) == len(rows[0]["seq_lengths"]) + len(rows[1]["seq_lengths"])
    saved = json.loads((tmp_path / "o" / "run_config.json").read_text())
    assert saved["packing"] is True
    # unpacked, the same run has one example per row: padded with --no-padding-free, else padding-free batches
    r = CliRunner().invoke(app, argv[:-1] + ["--no-padding-free", "--output-dir", str(tmp_path / "u")])
    assert r.exit_code == 0, r.output
    assert len(seen[1].train_dataset) == n_examples and not seen[1].padding_free
    r = CliRunner().invoke(app, argv[:-1] + ["--output-dir", str(tmp_path / "f")])
    assert r.exit_code == 0, r.output
    assert len(seen[2].train_dataset) == n_examples and seen[2].padding_free and not seen[2].args.packing
