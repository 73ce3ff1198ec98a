"""`python -m tpsample.cli ...`: the same as the `tpsample` command."""
import sys

from . import main

sys.exit(main())
