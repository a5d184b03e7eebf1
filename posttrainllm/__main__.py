import os
import sys

from posttrainllm.cli import main

if __name__ == "__main__":
    # `python -m posttrainllm` puts the working directory first on sys.path, so a file there (matplotlib.py, yaml.py)
    # would shadow an installed package when it is first imported; the package itself is already found.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)
    main()
