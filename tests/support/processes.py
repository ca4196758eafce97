"""Processes as tests see them: in the host's /proc, and children read while they run.

:func:`survivors` looks in /proc (tools run in PID namespaces of their own); :class:`Reading`
runs a command whose stdout and stderr are read as they come, so a test can wait for a line
the command prints before it ends. :func:`run_bench` runs a script of ``bench/`` to its end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The repository's root (bench scripts run from it, as ``hack/test`` runs them).
REPO = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<script>`` with ``args`` to its end; its output is captured as text."""
    return subprocess.run(
        [sys.executable, f"bench/{script}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
        check=False,
    )


def survivors(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


class Reading:
    """A child process whose stdout and stderr are read by threads as they come."""

    def __init__(
        self, argv: list[str], *, stdin: Any = None, env: Mapping[str, str] | None = None
    ) -> None:
        self.process = subprocess.Popen(
            argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self._read = {"stdout": b"", "stderr": b""}
        self._threads = [
            threading.Thread(target=self._drain, args=(name,), daemon=True) for name in self._read
        ]
        for thread in self._threads:
            thread.start()

    def _drain(self, name: str) -> None:
        stream = getattr(self.process, name)
        while chunk := os.read(stream.fileno(), 4096):
            self._read[name] += chunk

    def text(self, name: str) -> str:
        """What the child wrote to ``name`` (stdout or stderr) so far."""
        return self._read[name].decode(errors="replace")

    def finish(self, timeout: float) -> int:
        """Its exit status, once it ended (killed after ``timeout`` seconds)."""
        try:
            code = self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        for thread in self._threads:
            thread.join(timeout=10)
        return code
