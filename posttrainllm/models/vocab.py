"""Whether two tokenizers share one vocabulary: the same tokens under the same ids, and the same ids for a probe
text (the same merges and normalization). distill and `eval --reference` compare two models' next-token
distributions id by id, which only means something when this holds. Imports no torch."""

from __future__ import annotations

PROBE = "The quick brown fox, 1234 times.\ndef f(x):\n    return {'a': x}  # ünïcode"


def _show(token: str) -> str:
    text = repr(token)
    return text if len(text) <= 40 else text[:37] + "..."


def vocabulary_difference(ours, theirs, ours_name: str = "--model", theirs_name: str = "--teacher") -> str | None:
    """How tokenizer `theirs` differs from `ours` (None when they share the vocabulary), e.g. "token 'ab' is id 17
    in --model's vocabulary and 42 in --teacher's (and 3 more tokens differ)"."""
    a, b = ours.get_vocab(), theirs.get_vocab()
    if a != b:
        problems = []
        for token, i in sorted(a.items(), key=lambda item: item[1]):  # the lowest id first
            j = b.get(token)
            if j != i:
                there = f"missing from {theirs_name}'s" if j is None else f"{j} in {theirs_name}'s"
                problems.append(f"token {_show(token)} is id {i} in {ours_name}'s vocabulary and {there}")
        problems += [
            f"token {_show(t)} (id {j} in {theirs_name}'s vocabulary) is missing from {ours_name}'s"
            for t, j in b.items()
            if t not in a
        ]
        more = f" (and {len(problems) - 1} more tokens differ)" if len(problems) > 1 else ""
        return f"{problems[0]}{more}"
    if ours(PROBE, add_special_tokens=False)["input_ids"] != theirs(PROBE, add_special_tokens=False)["input_ids"]:
        return f"the same {len(a):,} tokens, but a sample text tokenizes to other ids (other merges or normalization)"
    return None
