"""spark-submit entry point: process one slice of one epoch (see onceflow.engine.slice_job)."""

import sys

from onceflow.engine.slice_job import main

if __name__ == "__main__":
    sys.exit(main())
