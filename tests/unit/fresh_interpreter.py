"""What a fresh interpreter has imported after running some code: how the layering tests see imports."""

from __future__ import annotations

import json
import subprocess
import sys


def modules_after(code: str, stdin: bytes = b"") -> list[str]:
    """The names in ``sys.modules`` of a new interpreter once ``code`` ran (``stdin`` on its input)."""
    shown = "\nimport json as _json, sys as _sys\nprint(_json.dumps(sorted(_sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code + shown], input=stdin, capture_output=True, check=True)
    return list(json.loads(done.stdout.decode().splitlines()[-1]))
