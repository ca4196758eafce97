"""Models called through litellm: one-line errors, retries by the real HTTP status, apiBase.

Real HTTP to loopback: the scripted model server (which answers 404 "no route <path>" at any
path but ``/chat/completions`` and records every path), or a tiny server answering a multi-line
HTML 404 at any path.
"""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pydantic
import pytest
from click.testing import CliRunner

from agentflows.agents import model, secrets
from agentflows.api import agent as agent_api
from agentflows.cli import main as cli
from agentflows.engine import capabilities
from tests.support.http_serving import ServedHTTP
from tests.support.model_server import ScriptedModelServer

HI = [{"role": "user", "content": "hi"}]
HTML_404 = b"<html>\n<body>\n<h1>404 Not Found</h1>\n<p>nothing\nhere</p>\n</body></html>\n"


class Html404(ServedHTTP):
    """Answers every POST with a multi-line HTML 404 (or ``status``), recording the paths."""

    def __init__(self, status: int = 404) -> None:
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.paths.append(self.path)
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(HTML_404)))
                self.end_headers()
                self.wfile.write(HTML_404)

        super().__init__(Handler)

    @property
    def url(self) -> str:
        return f"{self.origin}/v1"


@pytest.fixture
def html_404() -> Iterator[Html404]:
    with Html404() as server:
        yield server


async def _fail(spec: agent_api.ModelSpec, env: dict[str, str]) -> capabilities.CapabilityError:
    with pytest.raises(capabilities.CapabilityError) as error:
        await model.complete(spec, HI, env=env, redactor=secrets.Redactor())
    return error.value


async def test_litellm_model_error_is_one_line_naming_model_provider_status_and_message(
    html_404: Html404,
) -> None:
    spec = agent_api.ModelSpec(name="anthropic/claude-sonnet-4", api_base=html_404.url, retries=0)
    message = str(await _fail(spec, {}))
    assert "\n" not in message
    assert "Traceback" not in message and "litellm." not in message
    assert message.startswith("model anthropic/claude-sonnet-4 failed (HTTP 404): anthropic: ")
    assert "404 Not Found" in message and len(message) < 600


@pytest.mark.parametrize("name", ["anthropic/claude-sonnet-4", "ollama/llama3"])
async def test_litellm_404_is_permanent_and_asked_once(html_404: Html404, name: str) -> None:
    spec = agent_api.ModelSpec(name=name, api_base=html_404.url, retries=2)
    error = await _fail(spec, {})
    assert not error.retryable
    assert "(HTTP 404)" in str(error) and "attempts" not in str(error)
    assert len(html_404.paths) == 1


async def test_litellm_503_is_retried_and_says_how_often() -> None:
    with Html404(status=503) as server:
        spec = agent_api.ModelSpec(name="anthropic/claude-sonnet-4", api_base=server.url, retries=1)
        error = await _fail(spec, {})
    assert error.retryable and "(HTTP 503) after 2 attempts" in str(error)
    assert len(server.paths) == 2


async def test_anthropic_api_base_ending_in_v1_reaches_v1_messages_once(
    model_server: ScriptedModelServer,
) -> None:
    spec = model_server.model_spec(name="anthropic/claude-sonnet-4")
    assert spec.api_base and spec.api_base.endswith("/v1")
    error = await _fail(spec, model_server.env)
    assert [request.path for request in model_server.requests] == ["/v1/messages"]
    assert "no route /v1/messages" in str(error)


@pytest.mark.parametrize(
    ("name", "path"), [("ollama/llama3", "/api/generate"), ("ollama_chat/llama3", "/api/chat")]
)
async def test_ollama_api_base_ending_in_v1_reaches_the_servers_own_api(
    model_server: ScriptedModelServer, name: str, path: str
) -> None:
    await _fail(model_server.model_spec(name=name), model_server.env)
    assert [request.path for request in model_server.requests] == [path]


@pytest.mark.parametrize(
    "api_base", ["file:///etc/passwd", "ftp://host/v1", "http://", "http:///v1", "127.0.0.1:8000"]
)
def test_api_base_must_be_http_or_https_with_a_host(api_base: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="http:// or https://"):
        agent_api.ModelSpec(name="anthropic/claude-sonnet-4", api_base=api_base)


def test_api_base_accepts_http_and_https_urls() -> None:
    for api_base in ["http://127.0.0.1:11434/v1", "https://llm.internal:8443", "http://vllm/"]:
        assert agent_api.ModelSpec(name="openai/m", api_base=api_base).api_base == api_base


FILE_API_BASE = """
apiVersion: agentflows.io/v1alpha1
kind: Agent
metadata: {name: reader}
spec:
  model: {name: anthropic/claude-sonnet-4, apiBase: "file:///etc/passwd"}
---
apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: summarise}
spec:
  nodes:
    - id: ask
      llm: {model: {name: openai/gpt-4o-mini, apiBase: "file:///etc/shadow"}, prompt: hi}
"""


def test_validate_refuses_a_file_api_base_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "flow.yaml"
    path.write_text(FILE_API_BASE)
    result = CliRunner().invoke(cli.main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stdout.strip().splitlines()
    agent = [line for line in lines if "spec.model.apiBase" in line]
    llm = [line for line in lines if "spec.nodes[0].llm.model.apiBase" in line]
    assert agent and llm, lines
    assert all("http:// or https://" in line for line in agent + llm)


def test_an_agent_spec_llm_url_that_is_not_http_is_exit_2_naming_the_field(
    tmp_path: Path,
) -> None:
    from tests.unit.agentspec.test_fidelity import one_node_flow, run

    node = {
        "component_type": "LlmNode", "prompt_template": "How many letters in {{word}}?",
        "llm_config": {"component_type": "OpenAiCompatibleConfig", "name": "m",
                       "model_id": "m", "url": "ftp://models.internal/v1"},
        "outputs": [{"title": "count", "type": "integer"}],
    }  # fmt: skip
    code, _, err = run(tmp_path, one_node_flow(node, ["word"], "count"), "word=hello")
    assert code == 2, err
    assert "nodes[1].llm_config.url: 'ftp://models.internal/v1' is not a model endpoint" in err
