"""Drives `palisade mcp` with the official Python MCP SDK, as an agent host
does, and checks what it answers. Run by tests/tests/all/mcp.rs:

    python drive.py PALISADE_BIN WORKSPACE [palisade mcp's options...]

The workspace holds `policy.toml`'s declared tool `lister` in its Trial
stage (each run held for a person's approval). Prints one line per check
passed and exits 0, or fails with an assertion's message.
"""

import os
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.types import ElicitResult

PALISADE, WORKSPACE, OPTIONS = sys.argv[1], sys.argv[2], sys.argv[3:]
SERVER = StdioServerParameters(
    command=PALISADE, args=["mcp", *OPTIONS], env=dict(os.environ), cwd=WORKSPACE
)
# The token the cancelled run's command line carries, to find its process:
# a number of seconds of this driver's own (drivers may run side by side).
SLEEP_TOKEN = f"{600 + os.getpid()}.5"


def check(what, ok, detail=""):
    assert ok, f"{what}: {detail}"
    print(f"ok: {what}")


def processes_with(token):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


async def refused(session, tool, args):
    try:
        result = await session.call_tool(tool, args)
    except MCPError as e:
        return e
    raise AssertionError(f"{tool} {args} was not refused: {result}")


async def basics(s):
    init = await s.initialize()
    check("initialize names the server", init.server_info.name == "palisade", init.server_info)
    check("the instructions say what palisade is", "sandbox" in (init.instructions or ""))
    tools = {t.name: t for t in (await s.list_tools()).tools}
    check("the tools", sorted(tools) == ["apply_changes", "discard_changes", "explain", "list_changes", "run_command", "run_plugin", "run_tool", "session_exec", "session_list", "session_start", "session_stop", "show_changes"], sorted(tools))
    props = tools["run_command"].input_schema["properties"]
    check("run_command's schema", {"argv", "command", "workspace", "stdin", "timeout_secs", "output_limit_bytes"} <= set(props), props)
    check("a description written for a model", "refusal" in tools["run_command"].description)

    r = await s.call_tool("run_command", {"argv": ["echo", "hi there"]})
    sc = r.structured_content
    check("a run's output and status", (sc["exit_code"], sc["stdout"], r.is_error) == (0, "hi there\n", False), sc)
    check("its sandbox summarized", sc["sandbox"]["executor"].startswith("linux-tier") and len(sc["sandbox"]["execution_sha256"]) == 64, sc["sandbox"])
    check("the text for the model", r.content[0].text.startswith("exit status 0") and "hi there" in r.content[0].text, r.content[0].text)
    r = await s.call_tool("run_command", {"command": "printf '%s,' 'a b' c"})
    check("a command line split into words", r.structured_content["stdout"] == "a b,c,", r.structured_content)
    r = await s.call_tool("run_command", {"argv": ["cat"], "stdin": "from stdin"})
    check("stdin", r.structured_content["stdout"] == "from stdin", r.structured_content)
    r = await s.call_tool("run_command", {"argv": ["ls", "missing-file"]})
    check("a failing command's own status", r.structured_content["exit_code"] == 2 and "missing-file" in r.structured_content["stderr"], r.structured_content)
    r = await s.call_tool("run_command", {"argv": ["seq", "1", "100000"], "output_limit_bytes": 1000})
    sc = r.structured_content
    out = sc["stdout"]
    check("long output cut with a marker", sc["output_cut"] and "bytes cut here" in out and out.startswith("1\n2\n") and out.endswith("99999\n100000\n") and len(out) < 1200, out[:80])
    check("the full size still counted", sc["stdout_bytes"] == 588895, sc["stdout_bytes"])
    r = await s.call_tool("run_command", {"argv": ["sleep", "5"], "timeout_secs": 1})
    check("a deadline is a result palisade ended", r.is_error and r.structured_content["error_kind"] == "TimedOut", r.structured_content)
    r = await s.call_tool("run_command", {"argv": ["touch", "made-by-a-run"]})
    check("a run's writes: applied, said", r.structured_content["changes"]["outcome"] == "applied" and os.path.exists(os.path.join(WORKSPACE, "made-by-a-run")), r.structured_content)
    r = await s.call_tool("list_changes", {})
    check("list_changes answers", isinstance(r.structured_content["change_sets"], list), r.structured_content)
    e = await refused(s, "apply_changes", {"id": "000000000000", "host_executed": True})
    check("apply_changes never takes host_executed", e.code == -32602, (e.code, e.message))
    e = await refused(s, "show_changes", {"id": "000000000000"})
    check("an unknown change set refused with its rule", e.data["rule"] == "changes.unknown", e.data)


async def refusals(s):
    e = await refused(s, "run_command", {"argv": ["python3", "-c", "print(1)"]})
    check("a refusal is an MCP error with the stable kind", e.code == -32050 and e.data["kind"] == "PolicyDenied" and e.data["rule"] == "interpreters.denied", (e.code, e.data))
    e = await refused(s, "run_command", {"argv": ["cat", "/etc/shadow"]})
    check("a path outside the roots", e.data["kind"] == "WorkspaceScopeDenied", e.data)
    e = await refused(s, "run_command", {"argv": ["ls"], "timeout_sec": 3})
    check("an unknown argument named", e.code == -32602 and "timeout_sec" in e.message, (e.code, e.message))
    e = await refused(s, "run_command", {"argv": ["ls"], "workspace": ".."})
    check("a workspace outside the server's refused", (e.data["kind"], e.data["rule"]) == ("WorkspaceScopeDenied", "mcp.workspace"), e.data)
    os.makedirs(os.path.join(WORKSPACE, "sub"), exist_ok=True)
    r = await s.call_tool("run_command", {"argv": ["pwd"], "workspace": "sub"})
    check("a workspace inside it", r.structured_content["stdout"].strip().endswith("/sub"), r.structured_content)
    e = await refused(s, "run_command", {"argv": ["ls"], "command": "ls"})
    check("argv or command, not both", e.code == -32602, e.message)
    r = await s.call_tool("explain", {"argv": ["python3", "-c", "print(1)"]})
    sc = r.structured_content
    check("explain: a refusal explained", (sc["decision"], sc["rule"]) == ("deny", "interpreters.denied") and not r.is_error, sc)
    r = await s.call_tool("explain", {"argv": ["ls"]})
    check("explain: the sandbox", r.structured_content["decision"] == "allow" and "landlock" in r.structured_content["text"], r.structured_content["text"][:200])


async def progress(s):
    # The probe, in the workspace (where a run may execute it).
    notes = []

    async def on_progress(progress, total, message):
        notes.append((progress, message or ""))

    args = {"argv": ["./probe", "tick", "5", "600"]}
    r = await s.call_tool("run_command", args, progress_callback=on_progress)
    check("a long run's result", r.structured_content["exit_code"] == 0 and "tick 4" in r.structured_content["stdout"], r.structured_content)
    check("progress while it ran, with its latest output", any("bytes of output so far; latest:\ntick " in m for _, m in notes), notes)
    check("progress only grows", [p for p, _ in notes] == sorted(set(p for p, _ in notes)) and len(notes) >= 2, notes)


async def cancellation(s):
    check("no sleeper before", processes_with(SLEEP_TOKEN) == [])
    seen = []

    async def watch():
        for _ in range(200):
            seen.extend(processes_with(SLEEP_TOKEN))
            if seen:
                return
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        with anyio.move_on_after(30) as scope:
            async with anyio.create_task_group() as inner:
                async def call():
                    await s.call_tool("run_command", {"argv": ["sleep", SLEEP_TOKEN]})
                inner.start_soon(call)
                while not seen:
                    await anyio.sleep(0.05)
                inner.cancel_scope.cancel()
        check("the run was running", seen != [] and not scope.cancelled_caught, seen)
    deadline = time.monotonic() + 20
    while processes_with(SLEEP_TOKEN) and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    check("a cancelled call's run is killed", processes_with(SLEEP_TOKEN) == [], processes_with(SLEEP_TOKEN))
    r = await s.call_tool("run_command", {"argv": ["echo", "after"]})
    check("the server serves on", r.structured_content["stdout"] == "after\n")


async def session(callback, body):
    with tempfile.NamedTemporaryFile("w+", prefix="palisade-mcp-log-") as log:
        LOG["path"] = log.name
        await logged_session(callback, body, log)


async def logged_session(callback, body, log):
    async with stdio_client(SERVER, errlog=log) as (read, write):
        async with ClientSession(read, write, elicitation_callback=callback) as s:
            if body is not basics:
                await s.initialize()
            await body(s)


# The server's stderr, its log, of the session in progress.
LOG = {}


def answering_when_told(verb, told):
    """A progress callback that, told a run waits for a person's approval,
    answers it with `verb` as the server's log says (`palisade approve ID
    --socket S`): the command is in the log, never in the notification."""
    async def on_progress(progress, total, message):
        told.append(message or "")
        if "waiting for a person's approval" not in (message or ""):
            return
        check("the notification does not carry the command", "palisade approve" not in message, message)
        with open(LOG["path"]) as log:
            lines = [l for l in log if "approve the run with " in l]
        command = lines[-1].split("approve the run with ", 1)[1].split(" (or ", 1)[0].split()
        await anyio.run_process([PALISADE, verb, *command[2:]], check=True)
    return on_progress


def answering(approve, asked):
    async def callback(context, params):
        asked.append(params.message)
        return ElicitResult(action="accept", content={"approve": approve})
    return callback


async def approvals(mode):
    asked = []
    run = {"tool": "lister", "argv": ["ls"]}

    async def approved(s):
        r = await s.call_tool("run_tool", run)
        check(f"{mode}: an approval answered yes, the run runs", r.structured_content["exit_code"] == 0 and "policy.toml" in r.structured_content["stdout"], r.structured_content)
        check(f"{mode}: the person was asked, with the run's details", len(asked) == 1 and "lister" in asked[0] and "Approve this run?" in asked[0], asked)

    async def denied(s):
        e = await refused(s, "run_tool", run)
        check(f"{mode}: an approval answered no refuses the run", (e.code, e.data["kind"]) == (-32050, "NeedsApproval") and "Not approved" in e.data["message"], e.data)

    async def unasked(s):
        told = []
        r = await s.call_tool("run_tool", run, progress_callback=answering_when_told("approve", told))
        check(f"{mode}: without elicitation the person is told the run waits", any("waiting for a person's approval" in m for m in told), told)
        check(f"{mode}: and approved so, the run runs", r.structured_content["exit_code"] == 0, r.structured_content)

    await session(answering(True, asked), approved)
    await session(answering(False, []), denied)
    await session(None, unasked)


async def plugins(s):
    r = await s.call_tool("run_plugin", {"skill": "echo", "input": {"hello": ["world", 1]}})
    sc = r.structured_content
    check("a plugin's JSON output", sc["output"] == {"hello": ["world", 1]} and sc["fuel_used"] > 0, sc)
    check("its module's hash", len(sc["plugin"]["module_sha256"]) == 64, sc["plugin"])
    check("no store for a skill granted none", "store" in sc["plugin"] and sc["plugin"]["store"] is None, sc["plugin"])
    e = await refused(s, "run_plugin", {"skill": "nope", "input": 1})
    check("an unknown skill refused with its kind", e.code == -32050 and e.data["kind"] == "InvalidRequest", e.data)


async def parameters(s):
    # Last: a parameter lister does not declare escalates it back to Draft.
    e = await refused(s, "run_tool", {"tool": "lister", "argv": ["ls"], "params": {"dir": "../.."}})
    check("a parameter outside the server's workspace refused", (e.data["kind"], e.data["rule"]) == ("WorkspaceScopeDenied", "mcp.workspace"), e.data)
    os.makedirs(os.path.join(WORKSPACE, "sub"), exist_ok=True)
    told = []
    try:
        await s.call_tool("run_tool", {"tool": "lister", "argv": ["ls"], "params": {"dir": "sub"}}, progress_callback=answering_when_told("deny", told))
        raise AssertionError("an undeclared parameter ran")
    except MCPError as e:
        check("a parameter inside it goes on to the policy (an escalation, denied)", e.data["kind"] == "NeedsApproval" and "escalates" in " ".join(told), (e.data, told))


async def main():
    mode = os.environ.get("DRIVE_MODE", "mcp")
    await session(None, basics)
    await session(None, refusals)
    await session(None, progress)
    await session(None, cancellation)
    if os.environ.get("DRIVE_PLUGINS") == "1":
        await session(None, plugins)
    if os.environ.get("DRIVE_APPROVALS") == "1":
        await approvals(mode)
    await session(None, parameters)


anyio.run(main)
