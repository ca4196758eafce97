"""Run one fuzz case as a user would, in a forked child with a time and memory watchdog.

Used by ``tests/unit/test_fuzz_documents.py`` (a short derandomized profile) and by
``bench/fuzz.py`` (a campaign of thousands of cases). A :class:`Case` is the files a user
hands to ``agentflows validate`` and ``agentflows run --dry-run``; :func:`run_case` runs both
in-process (the functions behind ``validate``, then the ``run`` command through click's
``CliRunner``) and checks the invariants of issue 10, section 6:

- no exception escapes other than the project's own validation result (a list of Problems);
- every problem names where it is: its source starts with the file (``FILE#DOC ...``) and a
  problem about a document names a field path;
- a document that validates runs to a defined exit code (0, 1, 2, 3), and exit 1 is only ever
  a run that ended Failed (a crash exits 1 under click too, so it must never look like one);
- nothing is written outside the state directory and the input files.

:func:`run_isolated` forks a child per case so a hang, a memory blow-up or a crash of C code
(libyaml, jq) ends that case only: the child runs under an address-space limit and a file-size
limit, ``faulthandler`` dumps its stack and exits when the time is up, and the parent kills it
if it still has not answered. The child measures its wall time and the growth of its resident
memory (``VmHWM`` minus the ``VmRSS`` it started with, so C allocations count too).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import re
import resource
import select
import shutil
import signal
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from agentflows.api import documents
from agentflows.api import flow as flow_api
from agentflows.cli import local
from agentflows.cli import main as cli
from agentflows.engine import expressions

#: Exit codes of ``agentflows run`` (cli/main.py): success, failed run, bad input, waiting.
DEFINED_EXIT_CODES = frozenset({0, 1, 2, 3})
#: Largest file a case may write (state, snapshot); past it the kernel stops the child.
MAX_WRITTEN_BYTES = 64 * 1024 * 1024
#: Address space a case may add to the child before allocations fail (guards the machine).
ADDRESS_SPACE_HEADROOM = 768 * 1024 * 1024
#: Where a YAML syntax error is, as the loader reports it.
#: A YAML position: "line L, column C" from the parser, or "(line L)" after a value's problem
#: (a document that is one scalar, such as ``.inf``, has no field path but has a line).
_YAML_POSITION = re.compile(r"\bline \d+, column \d+|\(line \d+\)")
#: Frames of a crash's traceback kept in its report.
_TRACEBACK_FRAMES = 40


@dataclasses.dataclass(frozen=True)
class Case:
    """Files handed to ``validate`` and ``run --dry-run``, and the run's ``--name``.

    With one file the commands get that file; with several, the directory holding them (as a
    user runs ``agentflows validate examples/agents/``). ``{WS}`` in ``run_name`` stands for
    the case's workspace, so an absolute name can be tried without writing outside it.
    """

    files: tuple[tuple[str, bytes], ...]
    run_name: str | None = None
    state_dir_is_a_file: bool = False

    def text(self) -> str:
        """A readable form of the case for failure messages and reproducer files."""
        parts = []
        for name, content in self.files:
            body = content.decode("utf-8", "backslashreplace")
            if len(body) > 4000:
                body = body[:4000] + f"\n... ({len(content)} bytes in all)"
            parts.append(f"--- file {name} ({len(content)} bytes)\n{body}")
        if self.run_name is not None:
            parts.append(f"--- run --name {self.run_name!r}")
        if self.state_dir_is_a_file:
            parts.append("--- run --state-dir points at a file")
        return "\n".join(parts)


@dataclasses.dataclass
class Outcome:
    """What one case did: ``kind`` is ``accepted``/``rejected`` when no invariant broke."""

    kind: str
    stage: str = ""
    exit_code: int | None = None
    error: str = ""
    location: str = ""
    detail: str = ""
    seconds: float = 0.0
    peak_mb: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the case kept every invariant."""
        return self.kind in ("accepted", "rejected")

    def group(self) -> str:
        """The key failures are grouped by: kind, exception type and where it was raised."""
        return " | ".join(p for p in (self.kind, self.stage, self.error, self.location) if p)

    def report(self, case: Case) -> str:
        """A failure message: the group, measures, details and the case itself."""
        return (
            f"{self.group()} (exit {self.exit_code}, {self.seconds:.2f} s, "
            f"+{self.peak_mb:.0f} MB)\n{self.detail}\n{case.text()}"
        )


def _product_location(frames: list[traceback.FrameSummary]) -> str:
    """The deepest agentflows frame (else the deepest frame), as ``agentflows/x.py:N fn``."""
    for frame in reversed(frames):
        marker = frame.filename.rfind("/agentflows/")
        if marker >= 0 and "/tests/" not in frame.filename:
            return f"{frame.filename[marker + 1 :]}:{frame.lineno} {frame.name}"
    if frames:
        return f"{Path(frames[-1].filename).name}:{frames[-1].lineno} {frames[-1].name}"
    return ""


def _crash(stage: str, exc: BaseException) -> Outcome:
    frames = traceback.extract_tb(exc.__traceback__)
    # the innermost frames only: formatting a RecursionError's 1,000 frames takes seconds
    text = "".join(traceback.format_exception(exc, limit=-_TRACEBACK_FRAMES))
    return Outcome(
        "crash",
        stage,
        error=type(exc).__name__,
        location=_product_location(frames),
        detail=text[-6000:],
    )


def unplaced_reason(problem: documents.Problem, sources: list[str]) -> str | None:
    """Why a problem does not say where it is, or None when it does.

    A problem must read ``FILE#DOC (Kind name): path: message`` on one line: its source starts
    with one of the case's files, and a problem about one document (``#`` in the source) names
    a field path or, for YAML that does not parse, the line and column; a problem about the
    document as a whole says so. A problem about a whole file (bad encoding, too large) needs
    no path.
    """
    if "\n" in str(problem) or not problem.message.strip():
        return "not one line"
    source = next((s for s in sources if problem.source.startswith(s)), None)
    if source is None:
        return "source names no file"
    about_document = problem.source[len(source) :].startswith("#")
    located = bool(problem.path) or _YAML_POSITION.search(problem.message) is not None
    if about_document and not located and "document" not in problem.message:
        return "no field path"
    return None


def _write_inputs(case: Case, workspace: Path) -> tuple[list[Path], list[str]]:
    inputs = workspace / "in"
    inputs.mkdir()
    for name, content in case.files:
        (inputs / name).write_bytes(content)
    targets = [inputs] if len(case.files) > 1 else [inputs / case.files[0][0]]
    return targets, [str(inputs / name) for name, _ in case.files]


def _run_args(
    case: Case, loaded: documents.LoadResult, targets: list[Path], state: Path
) -> list[str]:
    args = ["run", *map(str, targets), "--dry-run", "-q", "--state-dir", str(state)]
    flows = loaded.of_kind(flow_api.Flow)
    if flows and flows[0].metadata.name:
        args += ["--flow", flows[0].metadata.name]
        input_value = _input_for(flows[0].spec.input)
        if input_value is not None:
            args += ["--input-json", input_value]
    if case.run_name is not None:
        args += ["--name", case.run_name.replace("{WS}", str(state.parent))]
    return args


def _input_for(schema: Any) -> str | None:
    """An input matching the Flow's schema, as the mock synthesizes it (None if it cannot)."""
    if schema is None:
        return None
    from agentflows.agents import mock

    try:
        return json.dumps(mock.synthesize(schema))
    except Exception:  # a schema the mock cannot follow: run without input
        return None


def _strays(workspace: Path, state: Path, inputs: list[str]) -> list[str]:
    allowed = {*inputs, str(workspace / "in")}
    strays = []
    for path in workspace.rglob("*"):
        if path.is_file() and str(path) not in allowed and not path.is_relative_to(state):
            strays.append(str(path.relative_to(workspace)))
    return strays


def run_case(case: Case, workspace: Path) -> Outcome:
    """Validate the case's files in-process and, when they are valid, ``run --dry-run`` them."""
    targets, sources = _write_inputs(case, workspace)
    try:
        loaded = documents.load_paths(targets)
        problems = local.validate_loaded(loaded)
    except Exception as exc:
        return _crash("validate", exc)
    unplaced = [(r, p) for p in problems if (r := unplaced_reason(p, sources)) is not None]
    if unplaced:
        reason, first = unplaced[0]
        lines = "\n".join(str(p) for _, p in unplaced)
        return Outcome("unplaced", "validate", error=reason, location=_shape(first), detail=lines)
    if problems:
        return Outcome("rejected", "validate", detail="\n".join(map(str, problems)))
    state = workspace / "home" / "user" / "project" / "state"
    if case.state_dir_is_a_file:
        state.parent.mkdir(parents=True)
        state.write_text("not a directory\n")
    result = CliRunner().invoke(cli.main, _run_args(case, loaded, targets, state))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return _crash("run", result.exception)
    outcome = Outcome("accepted", "run", exit_code=result.exit_code, detail=result.stderr[-2000:])
    if result.exit_code not in DEFINED_EXIT_CODES:
        outcome.kind = "bad-exit"
    elif result.exit_code == 1 and _phase(result.stdout) != "Failed":
        outcome.kind, outcome.error = "bad-exit", "exit 1 without a Failed run"
    strays = _strays(workspace, state, sources)
    if strays:
        outcome.kind, outcome.error = "escaped", "wrote outside the state directory"
        outcome.detail = f"files written: {strays}\n{outcome.detail}"
    return outcome


def _phase(stdout: str) -> str | None:
    try:
        return json.loads(stdout).get("phase")  # type: ignore[no-any-return]
    except (ValueError, AttributeError):
        return None


def _shape(problem: documents.Problem) -> str:
    """The form of an unplaced problem's source, e.g. ``Flow NAME``, ``FILE#N (NAME)``."""
    shape = re.sub(r"(/[^\s:#]+)+", "FILE", problem.source)
    shape = re.sub(r"#\d+", "#N", shape)
    shape = re.sub(r"\([^)]*\)", "(NAME)", shape)
    return re.sub(r"\b(Flow|Agent|FlowRun) \S+", r"\1 NAME", shape) or "(no source)"


def _memory_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _child(case: Case, workspace: Path, timeout: float, answer: int) -> None:
    """The body of the forked child: limits, watchdog, the case, one JSON answer."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(
        resource.RLIMIT_AS, (_memory_kb("VmSize") * 1024 + ADDRESS_SPACE_HEADROOM, hard)
    )
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_WRITTEN_BYTES, MAX_WRITTEN_BYTES))
    # An expression is bounded by 5 s by default, which a user may well need; the fuzzer's
    # bound per case is 2 s, so it lowers the expression bound to tell bounded from hung.
    expressions.DEFAULT_TIMEOUT_SECONDS = min(expressions.DEFAULT_TIMEOUT_SECONDS, timeout / 2)
    with (workspace.parent / "stack.txt").open("w") as stack:
        faulthandler.dump_traceback_later(timeout, exit=True, file=stack)
        baseline_kb = _memory_kb("VmRSS")
        started = time.perf_counter()
        try:
            outcome = run_case(case, workspace)
        except MemoryError as exc:
            outcome = _crash("case", exc)
            outcome.kind = "over-memory"
        outcome.seconds = time.perf_counter() - started
        outcome.peak_mb = max(0, _memory_kb("VmHWM") - baseline_kb) / 1024
        faulthandler.cancel_dump_traceback_later()
    os.write(answer, json.dumps(dataclasses.asdict(outcome)).encode())


def _hang_location(stack_text: str) -> str:
    """The deepest agentflows function of the main thread in a faulthandler dump.

    No line number: where a hang is caught within a function is chance, and one slow function
    must make one group.
    """
    frames = re.findall(r'File "([^"]+)", line \d+ in (\S+)', stack_text.split("\n\n")[-1])
    for filename, name in frames:  # faulthandler lists the innermost frame first
        marker = filename.rfind("/agentflows/")
        if marker >= 0:
            return f"{filename[marker + 1 :]} {name}"
    return f"{Path(frames[0][0]).name} {frames[0][1]}" if frames else ""


def _rss_kb(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(r"^VmRSS:\s+(\d+)", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


def _read_answer(fd: int, pid: int, deadline: float, limit_kb: int) -> tuple[bytes | None, int]:
    """The child's answer (None: out of time or memory) and the most memory it was seen using.

    Polls the child's resident size every 50 ms, so a blow-up is stopped at the limit rather
    than at the address-space limit, and a hang's memory is known too.
    """
    chunks: list[bytes] = []
    peak_kb = 0
    while True:
        left = deadline - time.monotonic()
        peak_kb = max(peak_kb, _rss_kb(pid))
        if left <= 0 or peak_kb > limit_kb:
            return None, peak_kb
        ready, _, _ = select.select([fd], [], [], min(left, 0.05))
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), peak_kb
        chunks.append(chunk)


_WARM: list[bool] = []
_WARM_UP_FLOW = b"""apiVersion: agentflows.io/v1alpha1
kind: Flow
metadata: {name: warm-up}
spec:
  input: {type: object}
  nodes: [{id: a, transform: "=1"}]
"""


def warm_up() -> None:
    """Run one valid case in this process, so every child starts with the run path imported."""
    if not _WARM:
        with tempfile.TemporaryDirectory(prefix="agentflows-fuzz-") as scratch:
            run_case(Case(files=(("warm-up.yaml", _WARM_UP_FLOW),)), Path(scratch))
        _WARM.append(True)


def run_isolated(case: Case, timeout: float, memory_mb: float) -> Outcome:
    """Run a case in a forked child; a hang, a blow-up or a signal ends only that child."""
    warm_up()
    scratch = Path(tempfile.mkdtemp(prefix="agentflows-fuzz-"))
    workspace = scratch / "ws"
    workspace.mkdir()
    reader, writer = os.pipe()
    baseline_kb = _memory_kb("VmRSS")
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        os.close(reader)
        try:
            _child(case, workspace, timeout, writer)
        finally:
            os._exit(0)
    os.close(writer)
    try:
        limit_kb = baseline_kb + int(memory_mb * 1024)
        answer, peak_kb = _read_answer(reader, pid, started + timeout + 5, limit_kb)
    finally:
        os.close(reader)
    if answer is None:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    seconds = time.monotonic() - started
    stack_file = scratch / "stack.txt"
    stack = stack_file.read_text(errors="replace") if stack_file.exists() else ""
    shutil.rmtree(scratch, ignore_errors=True)
    if answer:
        outcome = Outcome(**json.loads(answer))
        if outcome.ok and outcome.peak_mb > memory_mb:
            outcome.kind = "over-memory"
            outcome.error = f"grew {outcome.peak_mb:.0f} MB (limit {memory_mb:.0f} MB)"
        return outcome
    grown_mb = max(0, peak_kb - baseline_kb) / 1024
    if answer is None and grown_mb > memory_mb:
        return Outcome(
            "over-memory", error=f"over {memory_mb:g} MB", seconds=seconds, peak_mb=grown_mb
        )
    return _ended(status, stack, timeout, seconds, grown_mb, killed=answer is None)


def _ended(
    status: int, stack: str, timeout: float, seconds: float, grown_mb: float, killed: bool
) -> Outcome:
    """The outcome of a child that never answered: a hang, or a signal from C code."""
    if stack.strip():
        return Outcome(
            "hang",
            error=f"over {timeout:g} s",
            location=_hang_location(stack),
            seconds=seconds,
            peak_mb=grown_mb,
            detail=stack[-4000:],
        )
    if killed:
        return Outcome("hang", error=f"over {timeout + 5:g} s", seconds=seconds, peak_mb=grown_mb)
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return Outcome("killed", error=name, seconds=seconds, peak_mb=grown_mb)
    return Outcome("killed", error=f"exit status {status}", seconds=seconds, peak_mb=grown_mb)
