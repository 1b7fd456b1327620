"""``python -m mtf_core.train``: same as ``mtf-train``."""

import sys

from mtf_core.train.cli import main

sys.exit(main())
