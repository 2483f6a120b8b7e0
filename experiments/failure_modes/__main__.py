import sys

from experiments.failure_modes import main

sys.exit(main())
