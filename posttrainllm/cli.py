"""The `posttrainllm` command line: one short function per command; heavy imports only when a run starts.

Each command: parse (Typer) → resolve + validate the config (posttrainllm/config/, torch-free) → hand off to
`posttrainllm.commands.<command>.main`, which imports torch/transformers/TRL. Errors become exit codes here, in one
place.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from posttrainllm import __version__
from posttrainllm.commands.registry import SPECS
from posttrainllm.config import Opt, options_for, resolve
from posttrainllm.config.argv import not_an_option, with_bare_values
from posttrainllm.config.per_command import full_help
from posttrainllm.errors import PosttrainError, interruption_in

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

HELP = (
    "LLM post-training (SFT, DPO, raw-text finetune, from-scratch pretrain) on TRL/transformers, with "
    "layer-wise learning-rate decay (--llrd) to keep what the model already knows."
)


class OptionalValueCommand(TyperCommand):
    """Lets options with a `bare` value be given without one: `--llrd` alone means `--llrd 0.95`.

    Click has no optional-value options that also accept negative or text values, so the argument list is
    rewritten before parsing: a bare flag (followed by nothing or by another `--option`) gets its bare value.
    Anything else that follows is taken as the value and validated (so `--llrd -1` or `--llrd abc` are errors).

    The rewrite (and the deprecated names it maps to their option's flag) is posttrainllm/config/argv.py's, which
    the sweep uses to read its cells without Typer.
    """

    command_name: str = ""

    def parse_args(self, ctx, args):
        ctx.meta["posttrainllm.argv"] = [ctx.info_name, *args]  # the command line as given (model card, resume hint)
        try:
            return super().parse_args(ctx, with_bare_values(SPECS[self.command_name], list(args)))
        except Exception as e:  # click's NoSuchOption carries the flag: say which commands do take it
            flag = getattr(e, "option_name", None)
            reason = not_an_option(self.command_name, flag, SPECS) if isinstance(flag, str) else None
            if reason:
                e.message = reason
                e.possibilities = None
            raise


app = typer.Typer(
    name="posttrainllm",
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=TyperGroup,
    rich_markup_mode=None,
)


def _typer_param(o: Opt) -> inspect.Parameter:
    """An inspect.Parameter carrying the Typer option for one table entry (values arrive raw; config validates)."""
    help_text = full_help(o, SPECS) + (" [required]" if o.required else "")
    ann: Any
    if o.type is bool:
        ann = Annotated[
            bool | None, typer.Option(o.cli_flag, help=help_text, show_default=False, rich_help_panel=o.panel)
        ]
    elif o.type in (list, dict):
        ann = Annotated[
            list[str] | None,
            typer.Option(o.cli_flag, help=help_text, metavar=o.metavar, show_default=False, rich_help_panel=o.panel),
        ]
    else:
        shown = None if o.default is None else str(o.default)
        ann = Annotated[
            str | None,
            typer.Option(
                o.cli_flag,
                help=help_text + (f" [default: {shown}]" if shown else ""),
                metavar=o.metavar or o.type.__name__.upper(),
                show_default=False,
                rich_help_panel=o.panel,
            ),
        ]
    return inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)


def _register(name: str, help_text: str, handler: Callable[[Any], None]) -> None:
    """Create the Typer command `name` from the option table; its body resolves the config and calls handler."""
    spec = SPECS[name]
    opts = options_for(spec)

    def command(ctx: typer.Context, **kwargs: Any) -> None:
        debug = bool(kwargs.get("debug"))
        argv = ctx.meta.get("posttrainllm.argv", [name])
        code = guarded(lambda: handler(resolve(spec, kwargs, argv=argv)), debug)
        if code:
            raise typer.Exit(code)

    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    params += [_typer_param(o) for o in opts]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__ = name
    command.__doc__ = help_text
    cls = type(
        f"{name.title()}Command",
        (OptionalValueCommand,),
        {"command_name": name},
    )
    app.command(name, cls=cls, help=help_text)(command)


def guarded(fn: Callable[[], Any], debug: bool) -> int:
    """Run fn; turn the project's errors (and anything unexpected) into one clear line and an exit code."""
    try:
        fn()
        return 0
    except PosttrainError as e:
        if debug:
            raise
        _error(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - last resort: one line, traceback only with --debug
        stopped = interruption_in(e)  # a signal's stop, wrapped by a library it was raised inside
        if stopped is not None and not debug:
            _error(str(stopped))
            return stopped.exit_code
        if debug:
            raise
        _error(f"{type(e).__name__}: {e}".strip() + "  (run with --debug for the traceback)")
        return 1


def _error(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    # escaped: a message quoting e.g. "[/path/pair.cc:553]" is text, not markup
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", markup=True)


# -- the commands, from their specs (posttrainllm/commands/registry.py): each hands the resolved config to
# posttrainllm/commands/<command>.py's main (heavy imports happen there)
def _main_of(command: str) -> Callable[[Any], None]:
    spec = SPECS[command]

    def handler(cfg: RunConfig) -> None:
        if spec.trains:  # one main for every training command: the lifecycle runs the spec's setup
            from posttrainllm import lifecycle

            lifecycle.main(cfg, spec)
            return
        import importlib

        main = importlib.import_module(f"posttrainllm.commands.{command}").main
        if spec.runs_commands:  # the demo: it runs its stages through run_command
            main(cfg, run_command)
        else:
            main(cfg)

    return handler


def run_command(command: str, values: dict[str, Any]) -> None:
    """Resolve `values` as `command`'s options and run the command, as its command line would (the demo's stages)."""
    _main_of(command)(resolve(SPECS[command], values))


for _spec in SPECS.values():
    _register(_spec.name, _spec.help, _main_of(_spec.name))


_SWEEPABLE = [name for name, s in SPECS.items() if s.sweep]  # the commands whose specs say `sweep`
SWEEP_COMMANDS_TEXT = ", ".join(_SWEEPABLE[:-1]) + " or " + _SWEEPABLE[-1]
SWEEP_HELP = """Choose a forgetting method, γ and LR on your own data: run COMMAND (SWEEPABLE) for
every cell of a grid (with --merge-alpha, merge each trained cell back toward the base), and recommend a point of the
frontier.

\b
  posttrainllm sweep sft --model M --dataset D --eval-split 0.1 --ood-eval FILE [--ood-eval FILE2]
      --llrd 1.0,0.9,0.8 --lr 1e-5,2e-5,5e-5 [--seeds 0,1,2] [--replay-dataset F --replay-ratio 0,0.25]
      [--jobs N] [--max-forgetting 5] [--output-dir DIR] [--discard-weights] [other COMMAND options]

\b
Sweep options (comma-separated lists):
  --llrd G1,G2,...          layer-decay γ values (1.0 = flat) [default: 1.0]
  --lr LR1,LR2,...          base learning rates [required]
  --replay-ratio R1,...     replay ratios (0 = no replay; needs --replay-dataset or --self-replay) [default: 0]
  --kl-to-base B1,...       KL-anchor weights β (0 = none; sft, finetune) [default: 0]
  --self-replay N1,...      self-replay sample counts (0 = none; with --replay-ratio; sft, finetune) [default: 0]
  --loss-type L1,...        the loss (sft, finetune): nll (cross-entropy) and/or dft (Dynamic Fine-Tuning;
                            with --kl-to-base, the ASFT form) [default: nll]
  --merge-alpha A1,...      merge every trained cell back toward the base at these α (needs --eval-dataset)
  --merge-llrd G1,...       depth-scaled merges at these γ as well (1.0 = uniform)
  --seeds S1,S2,...         seeds; cells are averaged over them [default: 0]
  --jobs N                  cells run in parallel (CPU: threads split; GPUs: one per job) [default: 1]
  --max-forgetting PCT      forgetting budget of the recommendation, in % [default: 5]; given (with
                            --eval-dataset), each trained cell's budgeted point too: its largest merge toward the
                            base within PCT (posttrainllm merge --max-forgetting), labelled 'budget ≤PCT% of ...'
  --output-dir DIR          results.json, results.md, frontier.png, cells/ [default: runs/sweep-COMMAND-NAME]
  --discard-weights         delete each cell's weights and checkpoints once measured (keeps disk use small)
  --dry-run                 list each cell (done, or to run with its command line) and the merges; run nothing

Every cell is a normal COMMAND run (its options as usual, --eval-split or --eval-dataset and at least one
--ood-eval required). Run again, the sweep skips each cell that finished with the same settings and input
contents, measures only added --merge-alpha values, and keeps every earlier point in results.json.""".replace(
    "SWEEPABLE", SWEEP_COMMANDS_TEXT
)


@app.command("sweep", help=SWEEP_HELP, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def _sweep_command(
    ctx: typer.Context, command: Annotated[str, typer.Argument(help=SWEEP_COMMANDS_TEXT, metavar="COMMAND")]
) -> None:
    args = list(ctx.args)
    debug = "--debug" in args

    def go():
        from posttrainllm import sweep

        spec = sweep.parse(command, args)
        from posttrainllm.reporting import banner

        console = banner.console  # reads no markup: a cell's paths and the plot hint print as they are
        result = sweep.run(spec, echo=console.print)
        if result.get("dry_run"):
            return
        for line in sweep.recommendation_lines(result):
            console.print(line)
        if result.get("plot_note"):
            banner.note(result["plot_note"])
        console.print(f"results: {spec.output_dir / 'results.md'}")
        if result["failed"]:
            raise sweep.PosttrainError(sweep.failure_line(result, spec.output_dir))

    code = guarded(go, debug)
    if code:
        raise typer.Exit(code)


def _version_callback(value: bool):
    if value:
        print(f"posttrainllm {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool | None,
        typer.Option("--version", "-V", callback=_version_callback, is_eager=True, help="Show the version and exit."),
    ] = None,
):
    """LLM post-training with layer-wise learning-rate decay."""


def main() -> None:
    try:
        app(prog_name="posttrainllm")
    except SystemExit as e:
        if "posttrainllm.distributed" in sys.modules:  # a run under torchrun / accelerate launch: exit cleanly
            from posttrainllm.distributed import exit_process

            exit_process(e.code)
        raise


if __name__ == "__main__":
    main()
