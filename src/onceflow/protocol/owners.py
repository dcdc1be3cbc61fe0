"""Who owns an epoch in flight, and whether that owner still runs.

An owner is stored in the ledger as a name with the process and host it runs on, so that recovery on
the same host can tell a crashed runner (its pid is gone) from a live one without waiting for its
lease to expire. On another host only the lease tells.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable

# Whether an owner runs: True, False, or None when this process cannot tell (another host, no pid).
OwnerAlive = Callable[[str], "bool | None"]

_OWNER = re.compile(r"\(pid (\d+) on (\S+)\)$")


def owner_of_this_process(name: str) -> str:
    """An epoch owner's name as stored in the ledger: who, and which process on which host."""
    return f"{name} (pid {os.getpid()} on {socket.gethostname()})"


def process_alive(owner: str) -> bool | None:
    """Whether the owner's process still runs: known only for a process on this host."""
    found = _OWNER.search(owner or "")
    if found is None or found.group(2) != socket.gethostname():
        return None
    try:
        os.kill(int(found.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
