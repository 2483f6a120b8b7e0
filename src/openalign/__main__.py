"""`python -m openalign ...`: the same command line as `openalign ...`."""

import sys

from openalign.cli import main

sys.exit(main())
