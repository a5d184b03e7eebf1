"""Datasets for the trainers, through Arrow: memory follows the batch, not the dataset.

One job per command family:

* ``prepare_sft``  (``sft``): records -> TRL ``SFTTrainer`` rows: ``{"prompt", "completion"}`` (strings or message
  lists; the loss falls on the completion only, TRL's default for this shape), ``{"messages"}`` (loss on the whole
  conversation unless the trainer asks for ``assistant_only_loss``) or ``{"text"}``.
* ``prepare_dpo``  (``dpo``): records -> TRL ``DPOTrainer`` rows with an explicit prompt:
  ``{"prompt", "chosen", "rejected"}``, all strings or all message lists.
* ``prepare_kto``  (``kto``): records -> TRL ``KTOTrainer`` rows ``{"prompt", "completion", "label"}`` (unpaired
  preference data: one completion per row, label true when it is desirable).
* ``prepare_prompts`` (``grpo``/``rloo``): records -> ``{"prompt", other columns}``: the prompts the model completes,
  with the columns the reward functions read.
* ``prepare_text`` (``finetune``/``pretrain``): raw text -> fixed-length token blocks ``{"input_ids", "labels"}`` for
  transformers' ``Trainer``.

One module per concern:

============== ======================================================================================================
``reading``    files, folders, Hub ids -> a memory-mapped ``datasets.Dataset`` or an ``IterableDataset``; the
               constant-memory checks and scans behind the error messages (bad line, encoding, NUL bytes, empty)
``formats``    format detection from the columns and first rows; converting one record; degenerate-row reasons
``convert``    converting a whole dataset: batched ``Dataset.map`` (``num_proc``) or a stream, vectorized Arrow
               paths for the common shapes, degenerate rows dropped and counted
``chat``       the default chat template (with generation markers), the assistant spans of any template, and what a
               template leaves of a conversation at a ``--max-length``
``text``       raw text -> token blocks (batched tokenization, grouping in Arrow); text batches for tokenizers
``prepare``    ``prepare_sft`` / ``prepare_dpo`` / ``prepare_text``, splits, eval sets, ``describe``
``prompts``    prompt data for online RL: the prompt of each row, its other columns kept for the rewards
``replay``     replay mixing for sft rows and token blocks, datasets and streams
============== ======================================================================================================

Importing this package is cheap: ``datasets``, ``pyarrow`` and ``transformers`` are imported inside the functions.
"""

from .chat import DEFAULT_CHAT_TEMPLATE, ensure_chat_template
from .detect import detect_format
from .formats import (
    ALPACA_PROMPT,
    ALPACA_PROMPT_NO_INPUT,
    DPO_FORMATS,
    SFT_FORMATS,
    TEXT_FORMATS,
    convert_records,
)
from .loss_mask import LossMask, apply_loss_mask
from .prepare import PreparedData, describe, label_note, prepare_dpo, prepare_kto, prepare_sft, prepare_text
from .prompts import check_reward_columns, fit_completion_length, prepare_prompts
from .reading import load, read_records
from .replay import mix_replay
from .text import iter_texts, load_texts

__all__ = [
    "fit_completion_length",
    "SFT_FORMATS",
    "DPO_FORMATS",
    "TEXT_FORMATS",
    "DEFAULT_CHAT_TEMPLATE",
    "ALPACA_PROMPT",
    "ALPACA_PROMPT_NO_INPUT",
    "PreparedData",
    "LossMask",
    "apply_loss_mask",
    "load",
    "load_texts",
    "iter_texts",
    "read_records",
    "detect_format",
    "convert_records",
    "ensure_chat_template",
    "prepare_sft",
    "prepare_dpo",
    "prepare_kto",
    "prepare_prompts",
    "check_reward_columns",
    "label_note",
    "prepare_text",
    "describe",
    "mix_replay",
]
