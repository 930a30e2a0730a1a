"""`python -m linnet.cli`: the `linnet` command."""
import sys

from . import main

sys.exit(main())
