"""`python -m onnxfuse.targets.generator [DIR]` writes the capability files."""

import sys

from onnxfuse.targets.generator.generate import main

main(sys.argv[1:])
