"""The banner's notes on what a model's shape means for the run (commands/post_training.shape_notes): a big
vocabulary's logits at the run's batch and length, and sliding-window attention, read from the config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import Gemma3TextConfig, LlamaConfig

from posttrainllm.commands.post_training import shape_notes


def _model(config):
    return SimpleNamespace(config=config)


def test_a_big_vocabulary_says_what_the_logits_take():
    cfg = SimpleNamespace(max_length=128, batch_size=4)
    notes = shape_notes(_model(LlamaConfig(vocab_size=262_144)), cfg)
    assert len(notes) == 1 and "262,144 tokens" in notes[0] and "0.50 GiB" in notes[0]  # 262144 × 512 × 4 B
    assert shape_notes(_model(LlamaConfig(vocab_size=49_152)), cfg) == []


@pytest.mark.parametrize("length,past", [(128, False), (1024, True)])
def test_sliding_window_blocks_are_counted_and_a_longer_max_length_is_named(length, past):
    config = Gemma3TextConfig(vocab_size=1000, num_hidden_layers=6, sliding_window=512)
    (note,) = shape_notes(_model(config), SimpleNamespace(max_length=length, batch_size=2))
    sliding = sum(1 for k in config.layer_types if "sliding" in k)
    assert f"window 512) in {sliding} of 6 blocks" in note and sliding == 5
    assert ("is past it" in note) is past
