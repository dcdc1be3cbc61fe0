"""``python -m onceflow.cli``: the same command as ``onceflow``."""

import sys

from onceflow.cli.main import main

sys.exit(main())
