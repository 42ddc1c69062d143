import sys

from onnxfuse.cli import main

sys.exit(main())
