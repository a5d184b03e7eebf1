"""What a run prints and writes about itself: `banner.py` (the console, the run banner with the per-block LR table,
the summaries), `drift.py` (how far training moved each depth), `model_card.py` (the README.md model card) and
`records.py` (what a finished run records besides the model: the forgetting report, drift.json, the model card, the
interrupt message)."""
