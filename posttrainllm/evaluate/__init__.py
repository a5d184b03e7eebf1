"""Evaluation: held-out perplexity of plain texts, SFT completion loss, and forgetting reports.

Perplexity definition (used everywhere in this project, so numbers are comparable between runs):

* the whole text is tokenized ONCE, without special tokens (no BOS/EOS); it is read (a file: a few MB at a time),
  tokenized and scored as a stream, its text cut into pieces at pre-tokenizer boundaries (a newline followed by a
  non-space character) exactly as ``posttrainllm.data.text.split_text`` cuts the whole text, which gives the same
  ids as one call for byte-level BPE tokenizers; memory follows the batch, not the text
  (``posttrainllm/evaluate/stream.py``);
* the token ids are cut into consecutive, NON-overlapping windows of ``max_length`` tokens; the last window
  is whatever is left (it may be shorter); each window is scored on its own, with no context carried over;
* in a window of ``n`` tokens, tokens ``1..n-1`` are predicted from the tokens before them (``n - 1``
  predictions); a last window of a single token therefore predicts nothing;
* ``perplexity = exp(sum of NLL / number of predicted tokens)``, log-probabilities computed in float32.

Because windows do not overlap, the first tokens of every window have little context; the result depends on
``max_length`` and is higher than a sliding-window (strided) perplexity. Compare numbers only at equal
``max_length`` and tokenizer.

torch/transformers are imported inside the functions so that importing this module (and the CLI) stays fast.
"""

from posttrainllm.evaluate.files import _names_for_paths, evaluate_files
from posttrainllm.evaluate.report import forgetting_report, json_ready, load_for_eval
from posttrainllm.evaluate.scoring import _tokenize_text, text_perplexity
from posttrainllm.evaluate.sft import sft_completion_loss

__all__ = [
    "_names_for_paths",
    "_tokenize_text",
    "evaluate_files",
    "forgetting_report",
    "json_ready",
    "load_for_eval",
    "sft_completion_loss",
    "text_perplexity",
]
