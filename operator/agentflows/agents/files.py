"""Reference files: read an agent's ``files`` and turn them into the first turn of its conversation.

Called by :mod:`agentflows.agents.turn` when a turn starts (not when it resumes: the files are
already in the saved conversation). The Agent's ``files`` come first, then the agent node's.

Sources, each read by its owner of the same kind of access:

- ``configMapKeyRef``: through the host's :data:`ConfigMapReader` (the runner reads the
  ConfigMap from the API in the run's namespace; locally there is none, and the file is refused
  with a message saying to use ``path``);
- ``secretKeyRef``: the value of the secret reference, looked up by
  :func:`agentflows.agents.secrets.resolve` (in a pod, read from the secrets volume), as for
  API keys;
- ``path``: a file under :attr:`FileAccess.root` (locally the Flow file's directory; in the
  runner ``AGENTFLOWS_FILES_ROOT``, default :data:`POD_FILES_ROOT`, where a volume is mounted).
  The path is resolved, symbolic links included, and refused when it leaves the root; only a
  regular file is read (a FIFO, device or socket is refused, never waited on), in a thread;
- ``url``: fetched through the http tool's guard (:meth:`agentflows.agents.http_tool.
  HttpToolRunner.fetch`): allowed hosts, checked and pinned addresses, bounded body.

Each file is at most its ``maxBytes``, and all of a turn's files together at most
:data:`MAX_TOTAL_BYTES`. Text (``text/*``, JSON, YAML, XML, or undeclared bytes that decode as
UTF-8) is rendered into the context as ``<file name="...">`` blocks; images and PDFs become
content parts, only for a model litellm's table says accepts them (``supports_vision``,
``supports_pdf_input``), else the node fails with a message naming the file and the model.
The node's detail records each file's name, source, media type, size and sha256 digest, never
its content.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import mimetypes
import os
import posixpath
import stat
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentflows.agents import secrets
from agentflows.api import agent as agent_api
from agentflows.api import common
from agentflows.api import flow as flow_api
from agentflows.api import runner as runner_api
from agentflows.engine import capabilities

#: All reference files of one turn together, in bytes.
MAX_TOTAL_BYTES = 33_554_432
#: Where ``path`` files are looked for in a runner pod unless AGENTFLOWS_FILES_ROOT says.
POD_FILES_ROOT = runner_api.RUNNER_FILES_ROOT
FILES_ROOT_ENV = "AGENTFLOWS_FILES_ROOT"
_TEXT_TYPES = frozenset(
    {"application/json", "application/yaml", "application/x-yaml", "application/xml"}
)
PDF = "application/pdf"

#: Reads key ``key`` of ConfigMap ``name`` in the run's namespace (data or binaryData).
ConfigMapReader = Callable[[str, str], Awaitable[bytes]]


@dataclasses.dataclass(frozen=True)
class FileAccess:
    """Where a host lets reference files come from."""

    #: Directory ``path`` files are relative to and may not leave (None: paths are refused).
    root: Path | None = None
    config_map: ConfigMapReader | None = None


#: A host that reads neither local paths nor ConfigMaps (URLs and Secrets still work).
NO_FILE_ACCESS = FileAccess()


@dataclasses.dataclass(frozen=True)
class LoadedFile:
    """One file, read and checked."""

    name: str
    source: str
    content_type: str
    data: bytes

    def record(self) -> dict[str, Any]:
        """What the node's detail keeps: no content."""
        return {
            "name": self.name,
            "source": self.source,
            "contentType": self.content_type,
            "size": len(self.data),
            "sha256": hashlib.sha256(self.data).hexdigest(),
        }


class FileError(capabilities.CapabilityError):
    """A reference file could not be used; only a URL that may answer later is retryable."""


async def load(
    declared: Sequence[agent_api.ReferenceFile],
    access: FileAccess,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
) -> list[LoadedFile]:
    """Read every file, in order; raise :class:`FileError` for the first one unusable."""
    loaded: list[LoadedFile] = []
    total = 0
    for index, spec in enumerate(declared):
        where = f"files[{index}]"
        source, default_name, data = await _read(spec, where, access, env, redactor)
        if len(data) > spec.max_bytes:
            raise FileError(
                f"{where} ({source}): {len(data)} bytes, over maxBytes={spec.max_bytes}"
            )
        total += len(data)
        if total > MAX_TOTAL_BYTES:
            raise FileError(
                f"{where} ({source}): the files come to {total} bytes, over the "
                f"{MAX_TOTAL_BYTES} bytes all files of one agent may hold together"
            )
        name = spec.name or default_name
        loaded.append(LoadedFile(name, source, _content_type(spec, name, data), data))
    return loaded


async def _read(
    spec: agent_api.ReferenceFile,
    where: str,
    access: FileAccess,
    env: Mapping[str, str],
    redactor: secrets.Redactor,
) -> tuple[str, str, bytes]:
    """(source description, default name, bytes) of one file."""
    if spec.config_map_key_ref is not None:
        ref = spec.config_map_key_ref
        source = f"configmap {ref.name}/{ref.key}"
        if access.config_map is None:
            raise FileError(
                f"{where}.configMapKeyRef: ConfigMaps are read on a cluster only; locally, use path"
            )
        return source, ref.key, await access.config_map(ref.name, ref.key)
    if spec.secret_key_ref is not None:
        selector = spec.secret_key_ref
        value = secrets.resolve(
            common.SecretKeyRef(secret_key_ref=selector), env, field=f"{where}.secretKeyRef"
        )
        redactor.add(value)
        return f"secret {selector.name}/{selector.key}", selector.key, value.encode()
    if spec.path is not None:
        # In a thread: a slow disk (or a network filesystem) delays the run's deadline, not the
        # event loop that keeps it.
        data = await asyncio.to_thread(_read_path, spec, where, access)
        return f"path {spec.path}", posixpath.basename(spec.path), data
    assert spec.url is not None
    from agentflows.agents import http_tool  # httpx loads only when a file is fetched

    tool = agent_api.HttpTool(
        url=spec.url, allow_hosts=spec.allow_hosts, max_response_bytes=spec.max_bytes
    )
    runner = http_tool.HttpToolRunner(f"{where}.url", tool, env, redactor)
    try:
        data = await runner.fetch(spec.url)
    except http_tool.FetchError as exc:
        raise FileError(str(exc), retryable=exc.retryable, source=flow_api.RetryOn.HTTP) from None
    name = posixpath.basename(urllib.parse.urlsplit(spec.url).path) or "file"
    return f"url {spec.url}", name, data


def _read_path(spec: agent_api.ReferenceFile, where: str, access: FileAccess) -> bytes:
    """Read a path under the root, refusing one that leaves it (``..``, absolute, a link)."""
    assert spec.path is not None
    if access.root is None:
        raise FileError(f"{where}.path: this host reads no local files")
    root = access.root.resolve()
    target = (root / spec.path).resolve()
    if not target.is_relative_to(root):
        raise FileError(
            f"{where}.path: {spec.path!r} leads outside {root}; give a path inside that directory"
        )
    try:
        # Opened without blocking (a FIFO would wait for a writer forever) and read only when it
        # is a regular file: no FIFO, device or socket is read.
        descriptor = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            os.close(descriptor)
            raise FileError(
                f"{where}.path: {spec.path!r} is not a regular file; only regular files are read"
            )
        with os.fdopen(descriptor, "rb") as handle:
            size = status.st_size
            if size > spec.max_bytes:
                raise FileError(
                    f"{where} (path {spec.path}): {size} bytes, over maxBytes={spec.max_bytes}"
                )
            return handle.read(spec.max_bytes + 1)
    except OSError as exc:
        raise FileError(f"{where}.path: cannot read {spec.path!r}: {exc.strerror}") from None


def _content_type(spec: agent_api.ReferenceFile, name: str, data: bytes) -> str:
    if spec.content_type:
        return spec.content_type.split(";")[0].strip().lower()
    guessed = mimetypes.guess_type(name)[0]
    if guessed is not None:
        return guessed
    return "text/plain" if _decodes(data) else "application/octet-stream"


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _is_text(content_type: str) -> bool:
    return content_type.startswith("text/") or content_type in _TEXT_TYPES


def message(loaded: Sequence[LoadedFile], model: agent_api.ModelSpec) -> dict[str, Any] | None:
    """The user turn holding the files (None without files); refuse what the model cannot take.

    Content parts in the OpenAI format litellm translates for each provider: ``text``,
    ``image_url`` with a data URL, ``file`` with ``file_data``.
    """
    if not loaded:
        return None
    from agentflows.agents import model as model_client  # not before a model node needs it

    parts: list[dict[str, Any]] = []
    for file in loaded:
        if _is_text(file.content_type) or (
            file.content_type == "application/octet-stream" and _decodes(file.data)
        ):
            text = file.data.decode("utf-8", errors="replace")
            parts.append({"type": "text", "text": f'<file name="{file.name}">\n{text}\n</file>'})
            continue
        url = f"data:{file.content_type};base64,{base64.b64encode(file.data).decode()}"
        if file.content_type.startswith("image/"):
            _require(file, model, "images", model_client.supports("vision", model.name))
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif file.content_type == PDF:
            _require(file, model, "PDFs", model_client.supports("pdf_input", model.name))
            parts.append({"type": "file", "file": {"filename": file.name, "file_data": url}})
        else:
            raise FileError(
                f"file {file.name!r} ({file.source}) is {file.content_type}: only text, images "
                "and PDFs can be attached (set contentType if it is text)"
            )
    if all(part["type"] == "text" for part in parts):
        return {"role": "user", "content": "\n\n".join(part["text"] for part in parts)}
    return {"role": "user", "content": parts}


def _require(file: LoadedFile, model: agent_api.ModelSpec, what: str, supported: bool) -> None:
    if not supported:
        raise FileError(
            f"file {file.name!r} ({file.source}) is {file.content_type}, but model "
            f"{model.name} does not accept {what} (litellm's model table); use a model that "
            f"does, or attach text"
        )
