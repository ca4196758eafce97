"""Secret values for agents: where they come from, and keeping them out of everything we write.

The operator never reads a Secret. It injects each ``secretKeyRef`` a spec names into the
runner pod as an environment variable called :func:`secret_env_name` of the reference, and the
agents layer reads that variable here (locally, the user exports it). The same function is used by
the pod builder (``kube``) and the CLI, so the name is defined once.

Values read here are registered with a :class:`Redactor`, which every error message, detail
string and tool result passes through before it leaves the agents layer. A host seeds its
redactor with every secret its environment holds (:func:`env_secrets`), so a value that reaches
a tool's output some other way (printed by a script, echoed by a server) is masked too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from agentflows.api import common
from agentflows.engine import capabilities

#: Prefix of the environment variables that carry secret values into runner pods.
ENV_PREFIX = "AGENTFLOWS_SECRET_"

_NOT_ENV_SAFE = re.compile(r"[^A-Z0-9]")
#: Values shorter than this are not redacted: masking "a" or "1" would mangle every message.
_MIN_REDACTED_LENGTH = 4
REDACTED = "[redacted]"


def secret_env_name(ref: common.SecretKeySelector | common.SecretKeyRef) -> str:
    """Return the environment variable that carries the value of a secret reference.

    ``{name: llm-keys, key: openai}`` becomes ``AGENTFLOWS_SECRET_LLM_KEYS_OPENAI``.
    """
    selector = ref.secret_key_ref if isinstance(ref, common.SecretKeyRef) else ref
    return ENV_PREFIX + _NOT_ENV_SAFE.sub("_", f"{selector.name}_{selector.key}".upper())


def resolve(ref: common.SecretKeyRef, env: Mapping[str, str], *, field: str) -> str:
    """Return the secret value for ``ref`` from ``env``.

    Raises a permanent :class:`~agentflows.engine.capabilities.CapabilityError` naming the
    field, the Secret and the variable (never a value) when the variable is unset or empty.
    """
    name = secret_env_name(ref)
    value = env.get(name)
    if not value:
        selector = ref.secret_key_ref
        raise capabilities.CapabilityError(
            f"{field}: secret {selector.name}/{selector.key} is not available: environment "
            f"variable {name} is unset (the operator injects it in the runner pod; "
            f"export it when running locally)"
        )
    return value


def env_secrets(env: Mapping[str, str], names: Iterable[str] = ()) -> list[str]:
    """The secret values in ``env``: every ``AGENTFLOWS_SECRET_*`` variable and those in ``names``.

    ``names`` are the provider key variables of :data:`agentflows.agents.model.PROVIDER_KEY_ENV`.
    """
    wanted = set(names)
    return [
        value
        for key, value in env.items()
        if value and (key.startswith(ENV_PREFIX) or key in wanted)
    ]


class Redactor:
    """Replaces known secret values in text; share one per turn or host."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: set[str] = set()
        for value in values:
            self.add(value)

    def add(self, value: str) -> str:
        """Remember ``value`` as secret and return it unchanged."""
        if len(value) >= _MIN_REDACTED_LENGTH:
            self._values.add(value)
        return value

    def __call__(self, text: str) -> str:
        """Return ``text`` with every known secret value replaced by ``[redacted]``."""
        # Longest first, so a secret that contains another is masked whole.
        for value in sorted(self._values, key=len, reverse=True):
            text = text.replace(value, REDACTED)
        return text

    def value(self, value: Any) -> Any:
        """Return a JSON value with every known secret masked in its strings and keys."""
        if not self._values:
            return value
        if isinstance(value, str):
            return self(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            return {self.value(key): self.value(item) for key, item in value.items()}
        return value
