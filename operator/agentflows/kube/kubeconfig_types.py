"""The kubeconfig types: :class:`Config`, :class:`ConfigError` and the exec-credential protocol.

Their own module so :mod:`agentflows.kube.kubeconfig` (which loads a config) and
:mod:`agentflows.kube.kubeconfig_files` (which reads kubeconfig files with the ``kubernetes``
package, imported only when there are files) both use them without importing each other.
:mod:`agentflows.kube.kubeconfig` re-exports both names; callers use them from there.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any, Protocol

from agentflows.api import errors


class Credential(Protocol):
    """A credential that is re-run when it expires or is refused (an ``exec`` plugin's)."""

    status: dict[str, Any]
    expiry: datetime.datetime | None

    def run(self) -> None:
        """Run the plugin again (blocking); raise :class:`ConfigError` when it fails."""

    def stale(self) -> bool:
        """True when the credential has expired (or is about to)."""


class ConfigError(errors.AgentflowsError):
    """The cluster credentials cannot be loaded; the message says why in words.

    Not retryable, but for a failed run of an exec plugin: the next run may pass, as kubectl's
    next command would.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclasses.dataclass
class Config:
    """Where the API server is and how to authenticate (secrets stay in memory)."""

    server: str
    namespace: str = "default"
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    cert_data: str | None = None
    key_file: str | None = None
    key_data: str | None = dataclasses.field(default=None, repr=False)
    insecure: bool = False
    token: str | None = dataclasses.field(default=None, repr=False)
    token_file: str | None = None
    library: Any = dataclasses.field(default=None, repr=False)
    exec_credential: Credential | None = dataclasses.field(default=None, repr=False)

    def authorization(self) -> str | None:
        """The ``Authorization`` header value; the library refreshes what it loaded."""
        if self.exec_credential is not None:
            token = self.exec_credential.status.get("token")
            return f"Bearer {token}" if token else None
        if self.library is not None:
            value = self.library.get_api_key_with_prefix("BearerToken")
            return str(value) if value else None
        if self.token_file:
            # re-read each time: projected service-account tokens rotate
            return f"Bearer {Path(self.token_file).read_text().strip()}"
        return f"Bearer {self.token}" if self.token else None

    @property
    def expiration(self) -> datetime.datetime | None:
        """When the current credential expires (None: not known to)."""
        return self.exec_credential.expiry if self.exec_credential else None

    @property
    def renewable(self) -> bool:
        """True when a refused credential can be renewed (an exec plugin's)."""
        return self.exec_credential is not None

    def stale(self) -> bool:
        """True when :meth:`renew` should run before the next request."""
        return self.exec_credential is not None and self.exec_credential.stale()

    def renew(self) -> None:
        """Run the exec plugin again (blocking: call it in a thread from async code)."""
        if self.exec_credential is not None:
            self.exec_credential.run()
