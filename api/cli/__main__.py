"""`python -m api.cli ...`: the `engram` command (child processes start themselves this way)."""

import sys

from api.cli import main

sys.exit(main())
