"""``python -m bench``: the same as ``berth bench``."""

import sys

from bench.cli import main

sys.exit(main())
