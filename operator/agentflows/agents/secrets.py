"""Secret values for agents: where they come from, and keeping them out of everything we write.

The operator never reads a Secret. It mounts each ``secretKeyRef`` a spec names into the runner
pod as the file ``<Secret name>/<key>`` of a secrets volume at :func:`root` (never as an
environment variable: a process ``kubectl exec`` starts inherits the container's environment),
and the runner reads those files once at its start (:func:`mounted`) into the mapping its agents
look values up in, under the name :func:`secret_env_name` of the reference (locally the user
exports that variable). The same function is used by the pod builder (``kube``) and the CLI, so
the name is defined once. Tools never see the directory (:mod:`agentflows.agents.containment`).

Values read here are registered with a :class:`Redactor`, which every error message, detail
string and tool result passes through before it leaves the agents layer. A host seeds its
redactor with every secret its environment holds (:func:`env_secrets`), so a value that reaches
a tool's output some other way (printed by a script, echoed by a server) is masked too.

A value is masked in every encoding the runner itself produces when it passes a value on
(:func:`encodings`): JSON string escaping (nested too, as when a JSON document is quoted inside
another), URL encoding, and base64 of the exact value. What a tool or server does to a value
beyond that — reverse it, split it, change its case, base64 it at an offset inside a longer
string, encrypt it — cannot be recognised by any filter; README's Security section says so.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from agentflows.api import common
from agentflows.api import runner as runner_api
from agentflows.engine import capabilities

#: Prefix of the names under which secret values are looked up (environment variables locally).
ENV_PREFIX = "AGENTFLOWS_SECRET_"
#: Overrides :data:`agentflows.api.runner.RUNNER_SECRETS_ROOT` (the process kubelet's copy of the
#: mount; a Flow cannot set it, the prefix is the operator's).
SECRETS_ROOT_ENV = "AGENTFLOWS_SECRETS_ROOT"

_NOT_ENV_SAFE = re.compile(r"[^A-Z0-9]")
#: Values shorter than this are not redacted: masking "a" or "1" would mangle every message.
_MIN_REDACTED_LENGTH = 4
REDACTED = "[redacted]"
#: How many times a JSON string may be escaped inside another and still be recognised.
_JSON_NESTING = 3


def secret_env_name(ref: common.SecretKeySelector | common.SecretKeyRef) -> str:
    """Return the environment variable that carries the value of a secret reference.

    ``{name: llm-keys, key: openai}`` becomes ``AGENTFLOWS_SECRET_LLM_KEYS_OPENAI``.
    """
    selector = ref.secret_key_ref if isinstance(ref, common.SecretKeyRef) else ref
    return ENV_PREFIX + _NOT_ENV_SAFE.sub("_", f"{selector.name}_{selector.key}".upper())


def root(environ: Mapping[str, str] = os.environ) -> pathlib.Path:
    """The directory of the runner's secret files (it exists only in a runner pod)."""
    return pathlib.Path(environ.get(SECRETS_ROOT_ENV) or runner_api.RUNNER_SECRETS_ROOT)


def mounted(directory: pathlib.Path) -> dict[str, str]:
    """The values of the secret files ``<name>/<key>`` under ``directory``, by lookup name.

    Entries starting with ``..`` are the kubelet's (its atomic-update directories). Nothing when
    ``directory`` does not exist (no secret named, or not in a pod).
    """
    found: dict[str, str] = {}
    if not directory.is_dir():
        return found
    for secret in sorted(directory.iterdir()):
        if secret.name.startswith("..") or not secret.is_dir():
            continue
        for key in sorted(secret.iterdir()):
            if not key.name.startswith("..") and key.is_file():
                selector = common.SecretKeySelector(name=secret.name, key=key.name)
                found[secret_env_name(selector)] = key.read_text()
    return found


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


def _json_escapes(value: str) -> set[str]:
    """``value`` as it appears inside JSON strings, escaped once, twice... (both ASCII forms)."""
    forms: set[str] = set()
    for ensure_ascii in (True, False):
        text = value
        for _ in range(_JSON_NESTING):
            text = json.dumps(text, ensure_ascii=ensure_ascii)[1:-1]
            forms.add(text)
    return forms


def _base64_forms(value: str) -> set[str]:
    """Standard and URL-safe base64 of ``value``'s UTF-8 bytes, with and without padding."""
    raw = value.encode()
    forms: set[str] = set()
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        text = encoded.decode("ascii")
        forms.update((text, text.rstrip("=")))
    return forms


def encodings(value: str) -> set[str]:
    """Every form of ``value`` the runner can write: itself, JSON-escaped, URL-encoded, base64."""
    forms = {value} | _json_escapes(value) | _base64_forms(value)
    forms.update(
        (
            urllib.parse.quote(value, safe=""),
            urllib.parse.quote(value),
            urllib.parse.quote_plus(value),
            urllib.parse.quote_plus(value, safe=""),
        )
    )
    return forms


class Redactor:
    """Replaces known secret values in text; share one per turn or host."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: set[str] = set()
        for value in values:
            self.add(value)

    def add(self, value: str) -> str:
        """Remember ``value`` (in each of its :func:`encodings`) as secret; return it unchanged."""
        if len(value) >= _MIN_REDACTED_LENGTH:
            self._values.update(encodings(value))
        return value

    def __call__(self, text: str) -> str:
        """Return ``text`` with every known secret value replaced by ``[redacted]``."""
        # Longest first, so a secret that contains another is masked whole.
        for value in sorted(self._values, key=len, reverse=True):
            text = text.replace(value, REDACTED)
        return text

    @property
    def longest(self) -> int:
        """The length of the longest form of a known secret (0 when none is known)."""
        return max(map(len, self._values), default=0)

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


class StreamRedactor:
    """Redacts text that arrives in pieces: a secret split across two pieces is still masked.

    :meth:`feed` returns what may be shown now: the text so far, redacted, except its last
    ``longest - 1`` characters (the :attr:`Redactor.longest` form of any secret), which are held
    back because they may be the start of a secret the next piece completes. A secret not yet
    whole has at most that many characters in the buffer, all in its tail, so whatever leaves is
    final. :meth:`flush` returns the rest at the end of the text. Masked once whole, the
    secret's ``[redacted]`` may itself be held back in part: it is plain text the next round
    passes through unchanged.
    """

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = ""

    def feed(self, piece: str) -> str:
        """Take the next piece; return the redacted text that is safe to show now."""
        text = self._redactor(self._held + piece)
        keep = max(self._redactor.longest - 1, 0)
        cut = max(len(text) - keep, 0)
        self._held = text[cut:]
        return text[:cut]

    def flush(self) -> str:
        """Return the redacted text held back (the text has ended)."""
        text, self._held = self._redactor(self._held), ""
        return text

    def discard(self) -> None:
        """Forget the text held back (the attempt it belonged to broke off)."""
        self._held = ""
