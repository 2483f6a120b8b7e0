"""`python -m openalign.cli ...` (what torchrun runs with `-m`): the same command line as `openalign ...`."""

import sys

from openalign.cli.main import main

sys.exit(main())
