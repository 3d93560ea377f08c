"""`python -m dlinfra`."""

import sys

from dlinfra.cli import main

sys.exit(main())
