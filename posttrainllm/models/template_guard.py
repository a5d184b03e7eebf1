"""Chat templates are code from the model's files (tokenizer_config.json, chat_template.jinja, a GGUF file's
``tokenizer.chat_template``). transformers renders them in a Jinja sandbox, which keeps them away from files and
Python internals but bounds neither time nor memory: ``{{ 'x' * 6000000000 }}`` asks for 6 GB, and two nested
``range(100000)`` loops run for hours.

So before a tokenizer's template is used, it is rendered once in a child process, with transformers' own compiler,
on a few small conversations, under bounds: RENDER_S seconds of rendering, MEMORY_BYTES of address space and
OUTPUT_CHARS characters of output. A template that trips one is refused with a UsageError naming it (exit 2); a
template that merely raises (its own refusal of a conversation, e.g. no system role) passes: transformers reports that
the same way later. A template renders once per process (the verdict is kept by its hash).

The child is this module's main() in an isolated interpreter (``python -I``): the template and the special tokens on
stdin, one JSON verdict on stdout. Imports nothing heavy.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from posttrainllm.errors import UsageError

RENDER_S = 5.0  # rendering the probe conversations (a sound template takes milliseconds)
START_S = 60.0  # the whole child, its start (importing jinja2 through transformers) included, on a busy machine
MEMORY_BYTES = 2 << 30  # the child's address space
OUTPUT_CHARS = 1_000_000  # a few short messages render to a few hundred characters
TEMPLATE_BYTES = 16 << 20  # a chat template file (a tokenizer_config.json may hold a vocabulary too)

PROBES = (  # (messages, add_generation_prompt): what any chat template is used for
    ([{"role": "user", "content": "Hello"}], True),
    ([{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."}], False),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "3+3?"},
        ],
        True,
    ),
)
_VERDICTS: dict[str, str | None] = {}
# the child: isolated (-I: no working directory or PYTHONPATH on its path), this package found where it is
_CHILD = "import sys; sys.path.insert(0, {root!r}); from posttrainllm.models.template_guard import main; main()"


def templates_of(tokenizer) -> dict[str, str]:
    """The tokenizer's chat templates by name ("default" for a single one)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        return {"default": template}
    if isinstance(template, dict):
        return {str(k): v for k, v in template.items() if isinstance(v, str)}
    return {}


def check_tokenizer_templates(tokenizer, where: str) -> None:
    """Every chat template of `tokenizer` renders within the bounds (module docstring), or a UsageError naming it."""
    special = {k: v for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items() if isinstance(v, str)}
    from posttrainllm.data.chat import DEFAULT_CHAT_TEMPLATE  # ours: known to render

    for name, template in templates_of(tokenizer).items():
        problem = None if template == DEFAULT_CHAT_TEMPLATE else check_template(template, special)
        if problem:
            which = "" if name == "default" else f" {name!r}"
            raise UsageError(
                f"the chat template{which} of {where} {problem}, so it is refused; use a model whose template renders "
                "normally, or replace its 'chat_template' (tokenizer_config.json or chat_template.jinja)"
            )


def check_template_source(ref: str, where: str) -> None:
    """A chat template given by path (TRL's `chat_template_path`: a Jinja file, or a tokenizer directory), checked as
    a model's own; a hub id is left to TRL (nothing is downloaded here)."""
    import os

    path = Path(os.path.expanduser(ref))
    texts: dict[str, str] = {}
    if path.is_file():
        texts["default"] = _read_template(path, where)
    elif path.is_dir():
        if (path / "chat_template.jinja").is_file():
            texts["default"] = _read_template(path / "chat_template.jinja", where)
        elif (path / "tokenizer_config.json").is_file():
            try:
                config = json.loads(_read_template(path / "tokenizer_config.json", where))
            except ValueError:
                config = {}
            found = config.get("chat_template") if isinstance(config, dict) else None
            texts = {"default": found} if isinstance(found, str) else {}
    for template in texts.values():
        problem = check_template(template)
        if problem:
            raise UsageError(f"{where}={ref}: the chat template {problem}, so it is refused; fix or replace it")


def _read_template(path: Path, where: str) -> str:
    if path.stat().st_size > TEMPLATE_BYTES:
        raise UsageError(f"{where}: {path} is over {TEMPLATE_BYTES >> 20} MiB, not a chat template")
    return path.read_text(encoding="utf-8", errors="replace")


def check_template(template: str, special: dict[str, str] | None = None) -> str | None:
    """What is wrong with rendering `template` (None when it stays within the bounds), from a child process."""
    key = hashlib.sha256(template.encode("utf-8", "surrogatepass")).hexdigest()
    if key not in _VERDICTS:
        _VERDICTS[key] = _probe(template, special or {})
    return _VERDICTS[key]


def _probe(template: str, special: dict[str, str]) -> str | None:
    payload = json.dumps({"template": template, "special": special})
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD.format(root=str(Path(__file__).resolve().parents[2]))],
            input=payload,
            capture_output=True,
            text=True,
            timeout=START_S,
        )
    except subprocess.TimeoutExpired:
        return f"took over {START_S:g} s to render a short conversation"
    verdict = None
    for line in reversed(done.stdout.splitlines()):
        try:
            verdict = json.loads(line)
            break
        except ValueError:
            continue
    if not isinstance(verdict, dict):
        how = f"exit status {done.returncode}" if done.returncode >= 0 else f"signal {-done.returncode}"
        return f"made its renderer fail ({how}) on a short conversation"
    return verdict.get("problem")


def _render_all(template: str, special: dict[str, str]) -> str | None:  # pragma: no cover - runs in the child
    import signal

    from transformers.utils.chat_template_utils import _cached_compile_jinja_template

    class _Slow(Exception):
        pass

    def _stop(*_):
        raise _Slow

    try:
        compiled = _cached_compile_jinja_template(template)
    except Exception:  # noqa: BLE001 - a template that does not compile is reported by transformers itself
        return None
    signal.signal(signal.SIGALRM, _stop)
    signal.setitimer(signal.ITIMER_REAL, RENDER_S)
    try:
        for messages, generation in PROBES:
            size = 0
            try:
                for chunk in compiled.generate(messages=messages, add_generation_prompt=generation, **special):
                    size += len(chunk)
                    if size > OUTPUT_CHARS:
                        return f"rendered more than {OUTPUT_CHARS:,} characters for {len(messages)} short messages"
            except (_Slow, MemoryError):
                raise
            except Exception:  # noqa: BLE001,S112 - the template's own refusal of this conversation
                continue
    except _Slow:
        return f"took over {RENDER_S:g} s to render a short conversation (a loop or recursion that does not end)"
    except MemoryError:
        return f"needed more than {MEMORY_BYTES >> 30} GiB of memory to render a short conversation"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return None


def main() -> None:  # pragma: no cover - the child
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))  # first thing (no preexec_fn: threads)
    request = json.loads(sys.stdin.read())
    problem = _render_all(request["template"], request.get("special") or {})
    sys.stdout.write("\n" + json.dumps({"problem": problem}) + "\n")


if __name__ == "__main__":
    main()
