"""python -m ep_rt: see ep_rt.cli."""

import sys

from .cli import main

sys.exit(main())
