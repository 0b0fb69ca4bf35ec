"""`python -m services.evaluator.harness JOB.json` (or `--wait DEVICE`): an attempt's child (`main`)."""

import sys

from services.evaluator.harness.main import main

sys.exit(main(sys.argv[1:]))
