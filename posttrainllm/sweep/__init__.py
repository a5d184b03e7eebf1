"""`posttrainllm sweep COMMAND ...`: choose γ and LR on the user's own data.

Every cell of the grid (γ × LR × replay ratio × seed) is one normal `posttrainllm COMMAND` run, in its own output
directory under ``OUT/cells/``, started as a subprocess (so a failing cell does not stop the others, and each job
gets its own threads or GPU). The sweep is resumable: a cell whose run finished with the same settings and the same
input contents is skipped, the others run again, an added merge α is measured alone, and results.json keeps every
point it held before (under "earlier" when not measured again: posttrainllm/sweep/records.py).

Per cell it records the in-domain eval loss (from --eval-split / --eval-dataset), the out-of-domain perplexity
change of every --ood-eval file, and for dpo the reward accuracy and margin. Cells are aggregated over seeds
(mean ± std). A cell's *forgetting* is its worst OOD change: the largest seed-mean perplexity change over the
--ood-eval files, in percent.

The recommendation, deterministic for a fixed grid and seed list:

* ``best``: the lowest mean eval loss among cells whose forgetting is ≤ --max-forgetting;
* ``least_forgetting``: the least forgetting among cells whose eval loss is within 1% of the best eval loss of
  the whole grid;
* for each, the flat cell it beats: flat's forgetting (γ = 1, no replay) interpolated along flat's LR curve at the
  same eval loss, as docs/results.md does.

With --max-forgetting given (and --eval-dataset), every trained cell also gets its budgeted point: its largest
uniform merge toward the base whose mean held-out change is within the budget (`posttrainllm merge
--max-forgetting`, posttrainllm/sweep/merges.py), a point of its own labelled "budget ≤P% of ...".

Outputs in OUT: ``results.json`` (cells, summary, recommendation), ``results.md`` and ``frontier.png``
(in-domain eval loss against forgetting, one curve per γ, flat and replay shown; needs matplotlib).
"""

from posttrainllm.errors import PosttrainError
from posttrainllm.sweep.grid import NEAR_BEST, SWEEP_COMMANDS, Cell, SweepSpec, parse
from posttrainllm.sweep.results import (
    efficient_branch,
    failure_line,
    interpolate,
    plot_frontier,
    recommend,
    recommendation_lines,
    summarize,
    write_markdown,
)
from posttrainllm.sweep.runner import run

__all__ = [
    "NEAR_BEST",
    "SWEEP_COMMANDS",
    "Cell",
    "PosttrainError",
    "SweepSpec",
    "efficient_branch",
    "failure_line",
    "interpolate",
    "parse",
    "plot_frontier",
    "recommend",
    "recommendation_lines",
    "run",
    "summarize",
    "write_markdown",
]
