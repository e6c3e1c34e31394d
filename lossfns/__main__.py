"""`python -m lossfns`: the command line (`lossfns.cli`)."""

import sys

from .cli import main

sys.exit(main())
