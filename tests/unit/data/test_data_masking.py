"""Chat SFT learns the assistant's words: token-level checks of the loss mask for multi-turn messages, ShareGPT,
a system prompt, the default ChatML template (generation markers, through TRL) and a template without markers
(spans found here), computed independently from character offsets of the rendered text."""

from __future__ import annotations

import json
import shutil
import tempfile

import pytest
from data_samples import make_tokenizer, write_json, write_jsonl
from harness import run_args

from posttrainllm import data as D
from posttrainllm.errors import DataError

CONVERSATIONS = [
    {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What color is the sky?"},
            {"role": "assistant", "content": "It is blue."},
            {"role": "user", "content": "And grass?"},
            {"role": "assistant", "content": "Green, mostly."},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi there!"},
        ]
    },
]
SHAREGPT = [
    {
        "system": "Be kind.",
        "conversations": [
            {"from": "human", "value": "Name a fruit."},
            {"from": "gpt", "value": "An apple."},
            {"from": "human", "value": "Another?"},
            {"from": "gpt", "value": "A pear."},
        ],
    }
]

# A Llama-3-like template without {% generation %} markers: header tokens per turn, <|eot_id|> closes a turn.
NO_MARKERS = (
    "{{ bos_token }}{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Rewrites earlier assistant turns (drops their content when more turns follow): not prefix-preserving.
NOT_PREFIX = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}(earlier answer){% else %}{{ m['content'] }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def tok():
    t = make_tokenizer()
    t.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    return t


def expected_mask(tokenizer, messages, end_of_turn: str) -> tuple[list[int], list[int]]:
    """Independent reference: render, find each assistant content + its end-of-turn text by searching the rendered
    string in order, and mark the tokens whose characters fall inside those spans."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans, pos = [], 0
    for m in messages:
        at = text.index(m["content"], pos)
        pos = at + len(m["content"])
        if m["role"] == "assistant":
            end = text.index(end_of_turn, pos) + len(end_of_turn)
            spans.append((at, end))
            pos = end
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= s and e <= b for a, b in spans)) for s, e in enc["offset_mapping"]]
    return enc["input_ids"], mask


def labels_through_trl(tokenizer, prepared, loss):
    """The labels TRL's SFTTrainer builds for the prepared rows (its own dataset preparation)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    conf = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="posttrainllm-test-"),  # never the checkout (the suite checks it)
        max_length=512,
        report_to=[],
        use_cpu=True,
        bf16=False,
        assistant_only_loss=loss.assistant_only_loss,
        dataset_num_proc=None,
    )
    trainer = SFTTrainer(model=model, args=conf, train_dataset=prepared.train, processing_class=tokenizer)
    shutil.rmtree(conf.output_dir, ignore_errors=True)
    return [(row["input_ids"], row["labels"]) for row in trainer.train_dataset]


def _check(tokenizer, prepared, loss, conversations, end_of_turn):
    got = labels_through_trl(tokenizer, prepared, loss)
    assert len(got) == len(conversations)
    for (ids, labels), conv in zip(got, conversations):
        want_ids, want_mask = expected_mask(tokenizer, conv, end_of_turn)
        assert ids == want_ids
        for token, label, trained in zip(ids, labels, want_mask):
            if trained:
                assert label == token  # every assistant token keeps its label
            else:
                assert label == -100  # every other token (system, user, headers) is masked
        assert sum(want_mask) > 0


def test_default_chatml_masks_all_assistant_turns_through_trls_generation_markers(tmp_path, tok):
    path = write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS)
    prep = D.prepare_sft(str(path), tok)
    assert tok.chat_template == D.DEFAULT_CHAT_TEMPLATE and "{%- generation -%}" in D.DEFAULT_CHAT_TEMPLATE
    loss = D.apply_loss_mask(prep, tok)
    assert loss.assistant_only_loss and prep.train.column_names == ["messages"]
    assert loss.description.startswith("assistant turns (3 of 7 turns, ")
    _check(tok, prep, loss, [c["messages"] for c in CONVERSATIONS], "<|im_end|>" + tok.eos_token)


def test_sharegpt_with_system_prompt_is_masked_the_same_way(tmp_path, tok):
    path = write_json(tmp_path / "sg.json", SHAREGPT)
    prep = D.prepare_sft(str(path), tok)
    loss = D.apply_loss_mask(prep, tok)
    conv = prep.train[0]["messages"]
    assert [m["role"] for m in conv] == ["system", "user", "assistant", "user", "assistant"]
    _check(tok, prep, loss, [conv], "<|im_end|>" + tok.eos_token)


def test_a_template_without_markers_is_masked_by_prefix_rendering(tmp_path, tok):
    tok.chat_template = NO_MARKERS
    path = write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS)
    prep = D.prepare_sft(str(path), tok)
    assert prep.template_note is None  # the tokenizer's own template is used
    loss = D.apply_loss_mask(prep, tok)
    assert not loss.assistant_only_loss and prep.train.column_names == ["input_ids", "assistant_masks"]
    assert "prefix by prefix" in loss.description
    _check(tok, prep, loss, [c["messages"] for c in CONVERSATIONS], "<|eot_id|>")


@pytest.mark.parametrize("num_proc", [None, 1])
def test_masking_runs_in_this_process_unless_more_processes_are_asked_for(tmp_path, tok, monkeypatch, num_proc):
    """datasets 5 runs a map with num_proc=1 in a worker process; --dataset-num-proc 1 (the default) must not."""
    import os

    from posttrainllm.data import chat

    seen: list[int] = []
    batch = chat.AssistantSpans.batch

    def spy(self, conversations, wheres):
        seen.append(os.getpid())
        return batch(self, conversations, wheres)

    monkeypatch.setattr(chat.AssistantSpans, "batch", spy)
    tok.chat_template = NO_MARKERS
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS * 3)), tok, num_proc=num_proc)
    D.apply_loss_mask(prep, tok, num_proc=num_proc)
    assert seen and set(seen) == {os.getpid()}


def test_spans_of_a_batch_equal_the_spans_of_each_conversation_alone(tok):
    """One batched render/tokenize call gives each conversation what rendering it on its own gives, for
    multi-turn conversations, one opening with the assistant, and an assistant turn in the middle."""
    from posttrainllm.data.chat import AssistantSpans

    tok.chat_template = NO_MARKERS
    convs = [c["messages"] for c in CONVERSATIONS] + [
        [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Hi."}],
        [
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Yes."},
            {"role": "user", "content": "?"},
        ],
    ]
    spans = AssistantSpans(tok)
    ids, masks = spans.batch(convs, ["row"] * len(convs))
    for conv, got_ids, got_mask in zip(convs, ids, masks):
        want_ids, want_mask = expected_mask(tok, conv, "<|eot_id|>")
        assert (got_ids, got_mask) == (want_ids, want_mask) == spans(conv)


def test_a_template_that_rewrites_earlier_turns_is_an_error_not_a_silent_fallback(tmp_path, tok):
    tok.chat_template = NOT_PREFIX
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS)), tok)
    with pytest.raises(DataError, match="impossible to locate.*--train-on-prompt"):
        D.apply_loss_mask(prep, tok)


def test_train_on_prompt_keeps_whole_conversations(tmp_path, tok):
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS)), tok)
    loss = D.apply_loss_mask(prep, tok, train_on_prompt=True)
    assert not loss.assistant_only_loss and prep.train.column_names == ["messages"]
    got = labels_through_trl(tok, prep, loss)
    assert all(ids == labels for ids, labels in got)  # every token trained


def test_conversational_prompt_completion_trains_the_completion_only(tmp_path, tok):
    rows = [
        {
            "prompt": [{"role": "user", "content": "Say hi."}],
            "completion": [{"role": "assistant", "content": "Hi there!"}],
        }
    ]
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "pc.jsonl", rows)), tok)
    loss = D.apply_loss_mask(prep, tok)
    assert loss.description.startswith("completions (")
    ((ids, labels),) = labels_through_trl(tok, prep, loss)
    prompt = tok.apply_chat_template(rows[0]["prompt"], tokenize=False, add_generation_prompt=True)
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert all(label == -100 for label in labels[:n_prompt])  # the prompt (system/user turns, header) is masked
    assert labels[n_prompt:] == ids[n_prompt:]  # the assistant's completion is trained
    _, want_mask = expected_mask(tok, rows[0]["prompt"] + rows[0]["completion"], "<|im_end|>" + tok.eos_token)
    assert all(want_mask[n_prompt : len(want_mask) - 1])


def test_replay_rows_keep_their_whole_text_trained(tmp_path, tok):
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS * 4)), tok)
    text = tmp_path / "replay.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    prep.train = D.mix_replay(prep.train, D.load_texts(str(text)), 0.5, 0)
    tok.chat_template = NO_MARKERS  # the spans path
    loss = D.apply_loss_mask(prep, tok)
    assert not loss.assistant_only_loss and "input_ids" in prep.train.column_names
    replay = [r for r in prep.train if tok.decode(r["input_ids"]).count("user") == 0]
    assert replay
    for r in replay:
        content_ids = tok("the quick brown fox", add_special_tokens=False)["input_ids"]
        first = next(i for i in range(len(r["input_ids"])) if r["input_ids"][i : i + len(content_ids)] == content_ids)
        assert all(r["assistant_masks"][first : len(r["input_ids"]) - 1])  # the replayed text is trained


def test_dpo_prompts_stay_out_of_the_loss_through_trls_own_handling(tmp_path, tok):
    """DPO: TRL's preference tokenization keeps conversational prompts out of the loss (only chosen/rejected)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import DPOConfig, DPOTrainer

    rows = [
        {
            "prompt": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Name a fruit."}],
            "chosen": [{"role": "assistant", "content": "An apple."}],
            "rejected": [{"role": "assistant", "content": "A rock."}],
        }
    ] * 2
    prep = D.prepare_dpo(str(write_jsonl(tmp_path / "p.jsonl", rows)), tok)
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
    conf = DPOConfig(
        output_dir=str(tmp_path / "trl"),
        report_to=[],
        use_cpu=True,
        bf16=False,
        max_length=256,
        per_device_train_batch_size=2,
    )
    import copy

    trainer = DPOTrainer(
        model=model, ref_model=copy.deepcopy(model), args=conf, train_dataset=prep.train, processing_class=tok
    )
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])
    prompt_text = tok.apply_chat_template(rows[0]["prompt"], tokenize=False, add_generation_prompt=True)
    n_prompt = len(tok(prompt_text, add_special_tokens=False)["input_ids"])
    mask = batch["completion_mask"][0].tolist()
    assert not any(mask[:n_prompt]) and any(mask[n_prompt:])
    assert json.dumps(rows[0]["prompt"])  # the prompt is conversational


@pytest.mark.smoke
def test_the_model_learns_the_assistants_words_not_the_users(tiny_model_dir, tmp_path):
    """Behaviour: every user turn holds one distinctive phrase. Its perplexity falls far less with the default
    (assistant turns only) than with --train-on-prompt, where the phrase itself is trained on."""
    from typer.testing import CliRunner

    from posttrainllm.cli import app

    phrase = "the violet kettle hums over the quiet harbour"
    answers = ["ok", "yes", "sure", "noted", "fine", "done", "right", "good"]
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"{phrase} {i}"},
                {"role": "assistant", "content": answers[i % 8]},
                {"role": "user", "content": f"again {phrase}"},
                {"role": "assistant", "content": answers[(i + 3) % 8]},
            ]
        }
        for i in range(64)
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    probe = tmp_path / "phrase.txt"
    probe.write_text((phrase + "\n") * 30)
    change = {}
    for name, extra in (("default", []), ("train_on_prompt", ["--train-on-prompt"])):
        out = tmp_path / name
        r = CliRunner().invoke(
            app,
            run_args(
                "sft", tiny_model_dir, data, out, *extra, steps=30, batch=8, max_length=128, lr="3e-3", ood_eval=probe
            ),
        )
        assert r.exit_code == 0, r.output
        assert ("assistant turns (" in r.output) == (name == "default")
        change[name] = json.loads((out / "eval_results.json").read_text())["ood"]["phrase.txt"]["change_pct"]
    assert change["train_on_prompt"] < -60  # trained on the user's words: the phrase became easy
    assert change["default"] > change["train_on_prompt"] + 30  # far less with the assistant-only default
