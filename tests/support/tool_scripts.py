"""Python tool scripts that attack their own sandbox, shared by the tiers that run them.

The unit tier runs them as a root runner on the host (``tests/unit/security``), the cluster
tier in the runner's pod as its uid (``tests/cluster``); both assert on what they print.
"""

from __future__ import annotations

#: A fork bomb: it reads its arguments (any JSON), forks up to 150 children that wait on a
#: pipe, and prints how many it started before the process limit refused one.
FORK_BOMB = """
import json, os, sys
json.load(sys.stdin)
read, write = os.pipe()
started = 0
for _ in range(150):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    started += 1
print(json.dumps(started))
"""
