"""`python -m dlinfra`."""

import sys

from dlinfra.cli.main import main

sys.exit(main())
