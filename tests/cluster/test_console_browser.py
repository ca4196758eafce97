"""The console in a real browser, on the real control plane, acting as real users.

Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by Selenium opens
``agentflows console`` as it is deployed: behind an authenticating proxy, whose
``X-Forwarded-User``/``X-Forwarded-Groups`` headers the browser sends here (Chrome DevTools'
extra headers), and with a kubeconfig of the chart's console ServiceAccount — rendered by helm
from charts/agentflows and allowed only to impersonate. The operator runs as in
test_operator.py, the approvers' admission policy of config/policies is on, and runner pods run
as local processes, so every decision on the page goes through RBAC and the policy for real:
alice (group editors) approves, bob (group viewers) is refused with the API server's words.

The run's picture is drawn by Graphviz's ``dot`` (Debian's ``graphviz``). With
``AGENTFLOWS_CONSOLE_SCREENSHOTS=DIR`` the tests also save the screenshots the README
shows (runs list, a run's page, the inbox) into DIR.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.cluster.harness import REPO, Cluster, wait_for
from tests.cluster.operator_fixtures import *  # noqa: F403
from tests.cluster.operator_fixtures import (
    OPERATOR_NAMESPACE,
    PIECES,
    FlowRuns,
    Operator,
    start_told,
)
from tests.support.model_server import ScriptedModelServer

pytestmark = pytest.mark.cluster

sys.path.insert(0, str(REPO / "hack"))
from devcluster import build  # noqa: E402
from devcluster.ports import free_port  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)
CONSOLE_ACCOUNT = "agentflows-console"
SCRIPT = "<script>document.title='owned'</script>"
EDITORS = {"groups": ["editors"]}
#: Seconds a page may take to show what the cluster did (a runner pod starts as a process).
SHOWN = 120


# ----- the console as the chart deploys it -----------------------------------------------------


def _console_documents() -> list[dict[str, Any]]:
    """The chart's console ServiceAccount, ClusterRole and binding (helm template)."""
    done = subprocess.run(
        [str(build.helm_binary()), "template", "agentflows", str(REPO / "charts/agentflows"),
         "-n", OPERATOR_NAMESPACE, "--show-only", "templates/console.yaml",
         "--set", "console.enabled=true", "--set", "console.trustProxyFrom=127.0.0.1/32"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    return [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] in kinds]


def _console_kubeconfig(cluster: Cluster, path: Path) -> Path:
    """A kubeconfig holding a TokenRequest token of the console's ServiceAccount."""
    token = cluster.core().create_namespaced_service_account_token(
        CONSOLE_ACCOUNT, OPERATOR_NAMESPACE, {"spec": {"expirationSeconds": 86400}}
    )
    admin = yaml.safe_load(cluster.kubeconfig().read_text())
    entry = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [entry],
        "users": [{"name": CONSOLE_ACCOUNT, "user": {"token": token.status.token}}],
        "contexts": [
            {"name": "console", "context": {"cluster": entry["name"], "user": CONSOLE_ACCOUNT}}
        ],
        "current-context": "console",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _grant_users(cluster: Cluster) -> None:
    """What alice and bob may do (the policy still decides who decides a request)."""
    rules = [
        {
            "apiGroups": ["agentflows.io"],
            "resources": ["flowruns"],
            "verbs": ["get", "list", "watch", "create", "patch"],
        },
        {"apiGroups": ["agentflows.io"], "resources": ["flowruns/status"], "verbs": ["patch"]},
        {"apiGroups": ["agentflows.io"], "resources": ["flows"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
    ]
    meta = {"name": "test-console-users"}
    cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": meta, "rules": rules})  # fmt: skip
    subjects = [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
        for user in ("alice", "bob")
    ]
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": meta["name"]}
    cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": meta, "roleRef": role, "subjects": subjects})  # fmt: skip


@pytest.fixture(scope="module")
def console_kubeconfig(
    control_plane: Cluster, operator: Operator, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The chart's console account (impersonation only) and users' RBAC; its kubeconfig."""
    for document in _console_documents():
        control_plane.apply(document)
    _grant_users(control_plane)
    try:
        yield _console_kubeconfig(control_plane, tmp_path_factory.mktemp("console") / "config")
    finally:
        control_plane.kubectl(
            "delete", "clusterrolebinding/test-console-users", "clusterrole/test-console-users"
        )


@contextlib.contextmanager
def serving_console(kubeconfig: Path, *args: str) -> Iterator[str]:
    """``agentflows console ARGS`` with ``kubeconfig``, as a child process; its URL."""
    port = free_port()
    log_path = kubeconfig.parent / f"console-{port}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "agentflows.cli.main", "console", "--port", str(port), *args],
            stdout=log, stderr=log, env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _serving(url), 60, "the console serving")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        print(f"console log: {log_path}")


@pytest.fixture(scope="module")
def console_url(console_kubeconfig: Path) -> Iterator[str]:
    """The console behind a proxy at 127.0.0.1, as the chart runs it."""
    with serving_console(console_kubeconfig, "--trust-proxy-from", "127.0.0.1/32") as url:
        yield url


def _serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


# ----- browsers ----------------------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[Callable[[str, tuple[str, ...]], WebDriver]]:
    """Open a headless Chromium as a user the proxy vouches for: ``browser("alice", groups)``."""
    drivers: list[WebDriver] = []

    def open_as(user: str, groups: tuple[str, ...]) -> WebDriver:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-')}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        drivers.append(driver)
        driver.execute_cdp_cmd("Network.enable", {})
        headers = {"X-Forwarded-User": user, "X-Forwarded-Groups": ",".join(groups)}
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})
        return driver

    yield open_as
    for driver in drivers:
        driver.quit()


def screenshot(driver: WebDriver, name: str) -> None:
    """Save the page for the README when AGENTFLOWS_CONSOLE_SCREENSHOTS names a directory."""
    directory = os.environ.get("AGENTFLOWS_CONSOLE_SCREENSHOTS")
    if directory:
        driver.save_screenshot(str(Path(directory) / f"console-{name}.png"))


def shown(driver: WebDriver, css: str, text: str, timeout: float = SHOWN) -> None:
    """Wait until the element at ``css`` shows ``text`` (the page is never reloaded here)."""
    WebDriverWait(driver, timeout, poll_frequency=0.2).until(
        lambda d: any(text in e.text for e in d.find_elements(By.CSS_SELECTOR, css)),
        f"{css} never showed {text!r}",
    )


def node_phase(driver: WebDriver, node: str) -> str:
    graph = driver.find_element(By.CSS_SELECTOR, f'#graph [data-node="{node}"]')
    return str(graph.find_element(By.CSS_SELECTOR, '[data-field="phase"]').text)


# ----- flows -------------------------------------------------------------------------------------


def gate_flow(name: str) -> dict[str, Any]:
    """write (its output carries a script tag) -> review (editors approve) -> done."""
    return {
        "kind": "Flow",
        "metadata": {"name": name},
        "spec": {
            "input": {
                "type": "object",
                "properties": {"count": {"type": "integer", "minimum": 1}},
                "required": ["count"],
            },
            "nodes": [
                {"id": "write", "transform": "={text: $script, count: .run.input.count}"
                 .replace("$script", '"' + SCRIPT.replace("'", "\\u0027") + '"')},
                {"id": "review", "approval": {"message": "Publish?", "approvers": EDITORS}},
                {"id": "done", "transform": "={by: .nodes.review.json.decidedBy}"},
            ],
            "output": "=.nodes.done.json",
        },
    }  # fmt: skip


def start_waiting(runs: FlowRuns, flow: str, run: str) -> None:
    runs.apply({"kind": "FlowRun", "metadata": {"name": run},
                "spec": {"flow": flow, "input": {"count": 1}}})  # fmt: skip
    runs.wait_phase(run, "Waiting")


@pytest.fixture
def gate(runs: FlowRuns, console_url: str) -> FlowRuns:
    runs.apply(gate_flow("gate"))
    return runs


# ----- tests -------------------------------------------------------------------------------------


def test_alice_approves_from_the_inbox_and_the_run_continues(
    gate: FlowRuns, console_url: str, browser: Callable[..., WebDriver]
) -> None:
    start_waiting(gate, "gate", "gate-1")
    alice = browser("alice", ("editors",))
    alice.get(f"{console_url}/requests?namespace={gate.namespace}")
    screenshot(alice, "inbox")
    card = alice.find_element(By.ID, "request-gate-1-review")
    card.find_element(By.CSS_SELECTOR, "input[name=comment]").send_keys("ship it")
    card.find_element(By.CSS_SELECTOR, "button.decide-approve").click()
    shown(alice, ".notice", "gate-1 review: approve by alice", timeout=30)
    status = gate.wait_phase("gate-1", "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status
    assert status["output"] == {"by": "alice"}
    assert status["requests"]["review"]["comment"] == "ship it"


def test_bob_who_is_not_an_approver_sees_the_api_servers_refusal_on_the_page(
    gate: FlowRuns, console_url: str, browser: Callable[..., WebDriver]
) -> None:
    start_waiting(gate, "gate", "gate-2")
    bob = browser("bob", ("viewers",))
    bob.get(f"{console_url}/requests?namespace={gate.namespace}")
    bob.find_element(By.CSS_SELECTOR, "#request-gate-2-review button.decide-approve").click()
    shown(bob, ".notice.error", "The API server refused", timeout=30)
    refusal = bob.find_element(By.CSS_SELECTOR, ".notice.error").text
    assert "bob is not an approver of this request" in refusal, refusal
    request = gate.status("gate-2")["requests"]["review"]
    assert "decision" not in request and gate.status("gate-2")["phase"] == "Waiting"


def test_a_script_tag_in_a_node_output_is_shown_as_text_and_never_runs(
    gate: FlowRuns, console_url: str, browser: Callable[..., WebDriver]
) -> None:
    start_waiting(gate, "gate", "gate-3")
    alice = browser("alice", ("editors",))
    alice.get(f"{console_url}/runs/{gate.namespace}/gate-3")
    output = alice.find_element(By.CSS_SELECTOR, 'section[data-node="write"]').text
    assert SCRIPT in output
    assert alice.title == f"{gate.namespace}/gate-3 · agentflows"
    assert alice.find_elements(By.CSS_SELECTOR, "main script") == []


def test_the_start_form_checks_the_input_against_the_flows_schema(
    gate: FlowRuns, console_url: str, browser: Callable[..., WebDriver]
) -> None:
    alice = browser("alice", ("editors",))
    alice.get(f"{console_url}/flows?namespace={gate.namespace}")
    alice.find_element(By.CSS_SELECTOR, "#flow-gate input[name='field.count']").send_keys("0")
    alice.find_element(By.CSS_SELECTOR, "#flow-gate button.start").click()
    shown(alice, ".notice.error", "input.count: 0 is less than the minimum of 1", timeout=30)
    field = alice.find_element(By.CSS_SELECTOR, "input[name='field.count']")
    field.clear()
    field.send_keys("3")
    alice.find_element(By.CSS_SELECTOR, "button.start").click()
    WebDriverWait(alice, 30).until(lambda d: f"/runs/{gate.namespace}/gate-" in d.current_url)
    name = alice.current_url.rsplit("/", 1)[1]
    assert gate.run(name)["spec"]["input"] == {"count": 3}
    assert gate.run(name)["spec"]["trigger"] == {"type": "manual"}


def test_a_live_runs_node_phases_change_on_the_page_without_reload(
    gate: FlowRuns, console_url: str, browser: Callable[..., WebDriver], control_plane: Cluster
) -> None:
    alice = browser("alice", ("editors",))
    alice.get(f"{console_url}/runs?namespace={gate.namespace}")
    alice.execute_script("window.notReloaded = true")
    gate.apply({"kind": "FlowRun", "metadata": {"name": "gate-4"},
                "spec": {"flow": "gate", "input": {"count": 1}}})  # fmt: skip
    shown(alice, 'tr[data-key$="/gate-4"] [data-field="phase"]', "Waiting")
    shown(alice, 'tr[data-key$="/gate-4"] [data-field="pending"]', "1")
    screenshot(alice, "runs")
    alice.get(f"{console_url}/runs/{gate.namespace}/gate-4")
    alice.execute_script("window.notReloaded = true")
    assert node_phase(alice, "review") == "Waiting"
    assert node_phase(alice, "done") == "Pending"
    drawn = alice.find_element(By.ID, "picture")
    assert alice.execute_script("return arguments[0].naturalWidth", drawn) > 0
    screenshot(alice, "run")
    approved = subprocess.run(
        [sys.executable, "-m", "agentflows.cli.main", "approve", "gate-4", "-n", gate.namespace],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KUBECONFIG": str(control_plane.kubeconfig("alice"))},
    )  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    shown(alice, '#graph [data-node="done"] [data-field="phase"]', "Succeeded")
    shown(alice, '[data-field="run-phase"]', "Succeeded")
    assert node_phase(alice, "review") == "Succeeded"
    WebDriverWait(alice, 30).until(
        lambda d: "?at=" in str(d.find_element(By.ID, "picture").get_attribute("src"))
        and d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0",
                             d.find_element(By.ID, "picture")),
        "the run's picture was never drawn again",
    )  # fmt: skip
    assert alice.execute_script("return window.notReloaded") is True


def test_events_log_cancel_and_rerun_from_the_run_page(
    gate: FlowRuns, console_url: str, browser: Callable[..., WebDriver]
) -> None:
    start_waiting(gate, "gate", "gate-5")
    alice = browser("alice", ("editors",))
    alice.get(f"{console_url}/runs/{gate.namespace}/gate-5")
    assert "RequestCreated" in alice.find_element(By.CSS_SELECTOR, "table.events").text
    alice.find_element(By.XPATH, "//form[contains(@action, '/rerun')]/button").click()
    # the new run's generated name is "gate-" and five random characters, which may
    # begin with "5": compare the last path segment, not a substring of the URL
    WebDriverWait(alice, 30).until(lambda d: d.current_url.rsplit("/", 1)[1] != "gate-5")
    again = alice.current_url.rsplit("/", 1)[1]
    assert again.startswith("gate-"), alice.current_url
    assert gate.run(again)["spec"]["input"] == {"count": 1}
    alice.get(f"{console_url}/runs/{gate.namespace}/gate-5")
    alice.find_element(By.XPATH, "//form[contains(@action, '/cancel')]/button").click()
    assert gate.wait_phase("gate-5", "Cancelled")["phase"] == "Cancelled"
    shown(alice, '[data-field="run-phase"]', "Cancelled")


def _get(url: str, token: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_with_pass_tokens_the_users_token_decides_and_never_the_consoles_account(
    gate: FlowRuns, console_kubeconfig: Path, control_plane: Cluster
) -> None:
    start_waiting(gate, "gate", "gate-6")
    alice = yaml.safe_load(control_plane.kubeconfig("alice").read_text())["users"][0]["user"]
    with serving_console(console_kubeconfig, "--pass-tokens") as url:
        status, page = _get(f"{url}/runs?namespace={gate.namespace}", alice["token"])
        assert status == 200 and 'href="/runs/' in page and ">gate-6<" in page
        status, page = _get(f"{url}/runs?namespace={gate.namespace}", "not-a-token")
        assert status == 401, page
        assert "The API server refused: Unauthorized" in page


def test_an_offloaded_output_is_fetched_on_demand_and_shown_as_text(
    runs: FlowRuns, console_url: str, browser: Callable[..., WebDriver]
) -> None:
    lines = '[range(0; 3000) | "line <b>\\(.)</b>"] | join("\\n")'
    runs.apply(
        {
            "kind": "Flow",
            "metadata": {"name": "big"},
            "spec": {"nodes": [{"id": "write", "transform": f"={{text: ({lines})}}"}]},
        }
    )
    runs.apply({"kind": "FlowRun", "metadata": {"name": "big-1"}, "spec": {"flow": "big"}})
    status = runs.wait_phase("big-1", "Succeeded", "Failed")
    assert status["nodes"]["write"].get("outputRef"), status["nodes"]["write"]
    alice = browser("alice", ("editors",))
    alice.get(f"{console_url}/runs/{runs.namespace}/big-1")
    alice.find_element(By.LINK_TEXT, "Fetch the whole output").click()
    shown(alice, "main pre", "line <b>2999</b>", timeout=30)
    assert alice.find_elements(By.CSS_SELECTOR, "main b") == []


#: Installed once the page has loaded: the answer's length on the page at each change, with
#: the browser's clock (ms since the epoch), to time each piece from the model server to here.
RECORD_ARRIVALS = """
const section = document.getElementById("live-text");
const length = () => {
  const pre = section.querySelector('pre[data-stream-node="answer"]');
  return pre ? pre.textContent.length : 0;
};
window.arrivals = [[Date.now(), length()]];
new MutationObserver(() => window.arrivals.push([Date.now(), length()]))
  .observe(section, {subtree: true, childList: true, characterData: true});
"""


def piece_latencies_ms(sent: list[float], arrivals: list[list[float]]) -> dict[int, float]:
    """By piece number (1-based), for each piece not on the page yet when recording began: ms
    from the model server sending it to the page first showing it."""
    latencies, length = {}, 0
    for number, (piece, left) in enumerate(zip(PIECES, sent, strict=True), 1):
        length += len(piece)
        if length > arrivals[0][1]:
            shown_at = next(at for at, seen in arrivals if seen >= length)
            latencies[number] = shown_at - left * 1000
    return latencies


def test_a_runs_page_shows_the_agents_answer_while_the_model_writes_it(
    runs: FlowRuns,
    console_url: str,
    browser: Callable[..., WebDriver],
    pod_model_server: ScriptedModelServer,
) -> None:
    start_told(runs, pod_model_server, "told-web", gap=0.3)
    alice = browser("alice", ("editors",))
    alice.get(f"{console_url}/runs/{runs.namespace}/told-web")
    alice.execute_script("window.notReloaded = true;" + RECORD_ARRIVALS)
    text = '#live-text pre[data-stream-node="answer"]'
    try:
        wait_for(pod_model_server.holding.is_set, 180, "the model holding its answer")
        # the first three pieces are on the page while the model still holds the rest back
        shown(alice, text, "Restart the api pod", timeout=60)
        assert runs.status("told-web")["phase"] == "Running"
        assert "after" not in alice.find_element(By.CSS_SELECTOR, text).text
        screenshot(alice, "live-text")
    finally:
        pod_model_server.release()
    shown(alice, text, "Restart the api pod after draining its node.")
    shown(alice, '[data-field="run-phase"]', "Succeeded")
    WebDriverWait(alice, 60).until(
        lambda d: d.find_element(By.ID, "live-text").get_attribute("data-ended") == "true",
        "the live text never ended",
    )
    assert alice.execute_script("return window.notReloaded") is True
    status = runs.status("told-web")
    assert status["output"] == "".join(PIECES)
    assert "stream" not in json.dumps(status)
    # from the model server writing a piece to the page showing it (a figure, not a check)
    sent = pod_model_server.requests[-1].pieces_sent
    latencies = piece_latencies_ms(sent, alice.execute_script("return window.arrivals"))
    each = ", ".join(f"#{n} {ms:.0f}" for n, ms in latencies.items())
    print(
        f"model server -> console page: median {statistics.median(latencies.values()):.0f} ms"
        f" over {len(latencies)} pieces ({each} ms)"
    )


# ----- local runs --------------------------------------------------------------------------------


@pytest.fixture
def local_waiting_run(tmp_path: Path) -> Path:
    """A local run (``agentflows run``) of the gate Flow waiting at ``review``; its state dir."""
    flow = gate_flow("local-gate")
    flow["spec"]["nodes"][1]["approval"].pop("approvers")
    (tmp_path / "flow.yaml").write_text(yaml.safe_dump({"apiVersion": "agentflows.io/v1alpha1",
                                                         **flow}))  # fmt: skip
    state = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "agentflows.cli.main", "run", "flow.yaml", "--name", "gate-l",
         "--state-dir", str(state), "--input", "count=1", "-q"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    return state


def test_a_local_runs_page_draws_its_graph_and_follows_the_run_without_reload(
    local_waiting_run: Path, browser: Callable[[str, tuple[str, ...]], WebDriver]
) -> None:
    kubeconfig = local_waiting_run / "no-kubeconfig"
    with serving_console(kubeconfig, "--local", "--state-dir", str(local_waiting_run)) as url:
        page = browser("me", ())
        page.get(f"{url}/local/gate-l")
        assert node_phase(page, "review") == "Waiting"
        WebDriverWait(page, 30).until(
            lambda d: d.execute_script(
                "const p = document.getElementById('picture'); return p && p.naturalWidth > 0"
            ),
            "the run's graph picture never loaded",
        )
        subprocess.run(
            [sys.executable, "-m", "agentflows.cli.main", "resume", "gate-l", "--state-dir",
             str(local_waiting_run), "--request", "review", "--decision", "approve", "-q"],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        shown(page, '[data-field="run-phase"]', "Succeeded")
        assert node_phase(page, "done") == "Succeeded"
        page.get("about:blank")  # the page's event stream ends before the console stops


LOCAL_LOOP = {
    "apiVersion": "agentflows.io/v1alpha1",
    "kind": "Flow",
    "metadata": {"name": "local-loop"},
    "spec": {
        "nodes": [
            {"id": "draft", "transform": "={n: 1}"},
            {"id": "review", "approval": {"message": "draft {{ .nodes.revise.json.n // 1 }}?"}},
            {"id": "decide", "branch": {"value": "=.nodes.review.json.decision",
                                        "cases": {"approve": "done"}, "default": "revise"}},
            {"id": "revise", "transform": "={n: ((.nodes.revise.json.n // 1) + 1)}"},
            {"id": "done", "transform": "=.nodes.revise.json.n"},
        ],
        "edges": [
            {"from": "draft", "to": "review"},
            {"from": "review", "to": "decide"},
            {"from": "revise", "to": "review"},
        ],
    },
}  # fmt: skip


def test_a_local_loop_s_run_page_lists_the_iterations_and_follows_the_waiting_one_live(
    tmp_path: Path, browser: Callable[[str, tuple[str, ...]], WebDriver]
) -> None:
    (tmp_path / "loop.yaml").write_text(yaml.safe_dump(LOCAL_LOOP))
    state = tmp_path / "runs"

    def agentflows(*args: str, code: int) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "agentflows.cli.main", *args, "--state-dir", str(state), "-q"],
            capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == code, done.stderr

    agentflows("run", "loop.yaml", "--name", "loop-l", code=3)
    agentflows("resume", "loop-l", "--decision", "reject", "--comment", "again", code=3)
    row = 'table[data-iterations="review"] tr[data-node="{}"] [data-field="phase"]'
    with serving_console(state / "no-kubeconfig", "--local", "--state-dir", str(state)) as url:
        page = browser("me", ())
        page.get(f"{url}/local/loop-l")
        table = page.find_element(By.CSS_SELECTOR, 'table[data-iterations="review"]')
        rows = [r.text.split()[:3] for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")]
        assert rows == [["1", "review", "Succeeded"], ["2", "review#2", "Waiting"]]
        agentflows("resume", "loop-l", "--request", "review#2", "--decision", "approve", code=0)
        shown(page, row.format("review#2"), "Succeeded")
        shown(page, '[data-field="run-phase"]', "Succeeded")
        page.get("about:blank")  # the page's event stream ends before the console stops
