"""A client for palisade's broker over its Unix socket (JSON lines).

Standard library only. The protocol is docs/protocol.md of palisade; this
package speaks versions 12 to 21 of it (OLDEST_PROTOCOL_VERSION to
PROTOCOL_VERSION), and the broker answers with the highest both speak.

    from palisade_client import Client

    with Client() as broker:
        result = broker.run(["make", "test"])
        print(result.exit_code, result.stdout.decode())
"""

from __future__ import annotations

import base64
import errno
import json
import os
import socket
import stat
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union, cast

__all__ = [
    "Client",
    "PalisadeError",
    "RunResult",
    "default_socket",
    "own_socket",
    "system_socket",
    "SYSTEM_SOCKET",
    "shell_argv",
    "PROTOCOL_VERSION",
    "OLDEST_PROTOCOL_VERSION",
    "EXIT_PALISADE",
    "EXIT_NOT_APPLIED",
    "Stdin",
]

#: The highest protocol version this package speaks.
PROTOCOL_VERSION = 21
#: The lowest.
OLDEST_PROTOCOL_VERSION = 12
#: The exit status of palisade refusing or failing, as `palisade run` uses it.
EXIT_PALISADE = 125
#: The exit status of a run whose command ended by itself but whose writes
#: did not all land (held, partly applied or discarded), as `palisade run`
#: uses it.
EXIT_NOT_APPLIED = 123
#: The protocol version that streams a run's stdin while it runs.
STREAMED_STDIN_VERSION = 14
#: The protocol version that runs a command in a terminal.
TERMINAL_VERSION = 15
#: The protocol version that has sessions, sandboxes that stay.
SESSION_VERSION = 16
#: The protocol version that publishes a session's port to its requester.
PUBLISH_VERSION = 17
#: The protocol version that streams the stdin of a command in a session.
SESSION_STDIN_VERSION = 17
#: The protocol version whose results list the requests to inspected
#: domains (`egress_traffic.requests`).
INSPECTION_VERSION = 18
#: The protocol version whose results say when a run's writes did not all
#: land (`changes.outcome` "partial", `changes.held`, ...).
LOUD_CHANGES_VERSION = 19
#: The script that runs a line of a session's shell (docs/protocol.md,
#: "Sessions": a session's shell), exactly.
SHELL_SCRIPT = r'''__p=/tmp/.palisade-shell
if [ -f "$__p.env" ]; then
  while IFS= read -r __l; do case $__l in "export "*) __l=${__l#export }; unset "${__l%%=*}" 2>/dev/null;; esac; done <<__PALISADE__
$(export -p)
__PALISADE__
  . "$__p.env"
fi
if [ -f "$__p.cwd" ]; then IFS= read -r __l < "$__p.cwd" && cd "$__l" 2>/dev/null; fi
unset __l
trap 'pwd > "$__p.cwd"; export -p > "$__p.env"' EXIT
eval "$1"'''

#: The most rows, and the most columns, of a terminal's window.
WINDOW_MAX = 4096
#: The most one streamed piece of stdin carries.
STDIN_PIECE_BYTES = 64 * 1024

Json = Dict[str, Any]
#: Called with each piece of output: its stream ("stdout" or "stderr") and bytes.
OutputHandler = Callable[[str, bytes], None]
#: A run's stdin: bytes sent with the request, or a binary file (read to its
#: end) or an iterable of bytes, streamed while the command runs.
Stdin = Union[bytes, BinaryIO, Iterable[bytes]]
#: Called with each approval question of a run (the `approval_required`
#: object); when its `may_answer` is true, returns whether the person
#: approves (otherwise an approver answers elsewhere, and the return is not used).
ApprovalHandler = Callable[[Json], bool]


class PalisadeError(Exception):
    """The broker refused or failed: its error's `kind`, `message` and `rule`."""

    def __init__(self, kind: str, message: str, rule: Optional[str] = None, reply: Optional[Json] = None):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.rule = rule
        #: The error object as the broker sent it.
        self.reply: Json = reply or {}

    @classmethod
    def of(cls, error: Json) -> "PalisadeError":
        return cls(str(error.get("kind")), str(error.get("message")), error.get("rule"), error)


@dataclass
class RunResult:
    """A finished run: the broker's `finished` object, and the output the
    client gathered (when no output handler took it)."""

    #: "exited", "signaled", "timed_out", "quota_exceeded",
    #: "memory_limit_exceeded", "disk_limit_exceeded", "cancelled", or
    #: "stopped" (`stop_session`'s, from protocol version 20; a broker of
    #: 19 or older says "cancelled").
    status: str
    #: The command's exit code ("exited") or signal ("signaled").
    code: Optional[int]
    signal: Optional[int]
    #: The whole `finished` object: attestation, changes, figures.
    result: Json
    stdout: bytes = b""
    stderr: bytes = b""
    #: Approval questions the run put (`approval_required` objects).
    approvals: List[Json] = field(default_factory=list)

    @property
    def approved(self) -> Optional[Json]:
        """Who approved the run, where it was held for approval (from
        protocol version 21): `uid`, `name`, `rule` and `reason`."""
        approved = self.result.get("approved")
        return approved if isinstance(approved, dict) else None

    @property
    def writes_landed(self) -> bool:
        """Whether every write of the run landed on the host as the command
        left it: nothing held, partly applied, discarded or withheld."""
        changes = self.result.get("changes") or {}
        landed = changes.get("outcome", "none") in ("none", "applied", "in_place")
        return landed and changes.get("id") is None and not changes.get("withheld")

    @property
    def exit_status(self) -> int:
        """As `palisade run` exits: the code, 128+N for signal N, 125 when
        palisade ended the run, 123 when the command ended by itself (or the
        session was stopped) but its writes did not all land; 0 for a
        session stopped whose writes did."""
        ended_as_asked = self.code is not None or self.signal is not None or self.status == "stopped"
        if ended_as_asked and not self.writes_landed:
            return EXIT_NOT_APPLIED
        if self.status == "stopped":
            return 0
        if self.code is not None:
            return self.code
        if self.signal is not None:
            return 128 + self.signal
        return EXIT_PALISADE


def shell_argv(line: str) -> List[str]:
    """The command that runs `line` in a session's shell."""
    return ["/bin/sh", "-c", SHELL_SCRIPT, "palisade-shell", line]


#: The system broker's socket where the system configuration names no
#: other (`[clients] system_socket`): the system unit's on Linux, the
#: LaunchDaemon's on macOS (palisade_protocol::clients::SYSTEM_SOCKET).
SYSTEM_SOCKET = "/var/run/palisade.sock" if sys.platform == "darwin" else "/run/palisade/palisade.sock"
#: The system configuration, where `[clients] system_socket` may name another.
SYSTEM_CONFIG = "/etc/palisade/palisade.toml"


def default_socket() -> str:
    """The broker a client goes to, in palisade's one order (README.md,
    "Which broker runs a command"): $PALISADE_SOCKET; else this user's own
    broker's socket when a broker listens there; else the system broker's
    (`system_socket()`) when one listens there; else the user's own, which
    the connection then says is not there. There is no embedded broker."""
    configured = os.environ.get("PALISADE_SOCKET")
    if configured:
        return configured
    own = own_socket()
    if _trusted_own(own) and _listening(own):
        return own
    system = system_socket()
    if system != own and _listening(system):
        return system
    return own


def own_socket() -> str:
    """Where this user's own broker listens: on Linux
    $XDG_RUNTIME_DIR/palisade/palisade.sock, else /run/user/UID/... where
    that directory exists, else $TMPDIR/palisade-UID/palisade.sock (only
    while that directory is the user's and closed to others); on macOS
    $TMPDIR/palisade/palisade.sock. Root's is the system socket."""
    uid = os.geteuid()
    temp = os.environ.get("TMPDIR") or "/tmp"
    if uid == 0:
        return SYSTEM_SOCKET
    if sys.platform == "darwin":
        return os.path.join(temp, "palisade", "palisade.sock")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "palisade", "palisade.sock")
    if os.path.isdir(f"/run/user/{uid}"):
        return os.path.join(f"/run/user/{uid}", "palisade", "palisade.sock")
    return os.path.join(temp, f"palisade-{uid}", "palisade.sock")


def _trusted_own(path: str) -> bool:
    """Whether the user's own socket is where only the user could have put
    it: anywhere but $TMPDIR/palisade-UID, which must be the user's and
    closed to others (one another user made first in a shared /tmp is not)."""
    uid = os.geteuid()
    private = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"palisade-{uid}")
    if os.path.dirname(path) != private:
        return True
    try:
        st = os.lstat(private)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and st.st_mode & 0o077 == 0


def system_socket() -> str:
    """The system broker's socket: `[clients] system_socket` of the system
    configuration ($PALISADE_SYSTEM_CONFIG, else /etc/palisade/palisade.toml;
    read with Python 3.11's tomllib, so not before), else SYSTEM_SOCKET."""
    path = os.environ.get("PALISADE_SYSTEM_CONFIG") or SYSTEM_CONFIG
    if sys.version_info < (3, 11):
        return SYSTEM_SOCKET
    import tomllib

    try:
        with open(path, "rb") as f:
            clients = tomllib.load(f).get("clients", {})
    except (OSError, ValueError):
        return SYSTEM_SOCKET
    named = clients.get("system_socket") if isinstance(clients, dict) else None
    return named if isinstance(named, str) and named else SYSTEM_SOCKET


def _listening(path: str) -> bool:
    """Whether something is at `path` beyond "nothing there" (no socket, or
    one nobody listens on): a broker, or one that refuses this user, which
    the connection then says."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
        return True
    except OSError as e:
        return e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ECONNREFUSED)
    finally:
        probe.close()


def _decode_bytes(value: Union[str, Json]) -> bytes:
    """A byte field: text, or {"base64": ...}."""
    if isinstance(value, str):
        return value.encode()
    return base64.b64decode(value["base64"])


def _encode_bytes(data: bytes) -> Union[str, Json]:
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        return {"base64": base64.b64encode(data).decode()}
    return text


class Client:
    """One connection to a broker. Requests go one at a time."""

    def __init__(self, path: Optional[str] = None, *, connect_timeout: Optional[float] = 10.0):
        self.path = path or default_socket()
        self._connect_timeout = connect_timeout
        hello: Json = {"magic": "palisade", "version": PROTOCOL_VERSION, "min_version": OLDEST_PROTOCOL_VERSION,
                       "encoding": "json"}
        reply = self._greet(hello)
        # A broker of version 12 knows no range and refuses any other version:
        # it is asked again in version 12 alone.
        refused = reply.get("error") or {}
        if refused.get("kind") == "ProtocolError" and "is not supported" in str(refused.get("message")):
            self.close()
            reply = self._greet({"magic": "palisade", "version": OLDEST_PROTOCOL_VERSION, "encoding": "json"})
        if "error" in reply:
            self.close()
            raise PalisadeError.of(reply["error"])
        answered = reply.get("hello", {})
        #: The protocol version this connection speaks.
        self.version: int = int(answered.get("version", 0))
        #: The broker's name and version ("palisaded 0.1.0").
        self.broker: str = str(answered.get("broker", ""))
        if not OLDEST_PROTOCOL_VERSION <= self.version <= PROTOCOL_VERSION:
            self.close()
            raise PalisadeError("ProtocolError", f"the broker answered version {self.version}")

    def _greet(self, hello: Json) -> Json:
        """Connects and says `hello`; the broker's answer."""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(self._connect_timeout)
        try:
            self._sock.connect(self.path)
        except OSError:
            self._sock.close()
            raise
        self._sock.settimeout(None)
        # Taken by every send: a streamed stdin is sent from a thread of its
        # own, and only while its run is the one in progress (the runs ended
        # on this connection are counted under the lock).
        self._sending = threading.Lock()
        self._runs_ended = 0
        # Whether a run is in progress (started, not yet answered).
        self._running = False
        # Why a run's streamed stdin could not be read (its thread's error).
        self._stdin_failed: Optional[BaseException] = None
        # A buffered reader of the socket: lines, and raw output after them.
        self._lines = cast(BinaryIO, self._sock.makefile("rb", buffering=1 << 20))
        self._send({"hello": hello})
        return self._receive()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._lines.close()
        self._sock.close()

    def _send(self, message: Union[Json, str], run: Optional[int] = None) -> bool:
        """Sends `message`; with `run`, only while that run is in progress
        (False: it ended, nothing was sent)."""
        line = json.dumps(message).encode() + b"\n"
        with self._sending:
            if run is not None and run != self._runs_ended:
                return False
            self._sock.sendall(line)
            return True

    def _run_ended(self) -> None:
        with self._sending:
            self._runs_ended += 1
            self._running = False

    def _feed(self, stdin: Union[BinaryIO, Iterable[bytes]], run: int) -> None:
        """Sends `stdin` as the pieces of `run`, then its end; stops once the
        run is over (no piece reaches the next run) or the connection fails."""
        pieces: Iterable[bytes]
        if hasattr(stdin, "read"):
            source = cast(BinaryIO, stdin)
            pieces = iter(lambda: source.read(STDIN_PIECE_BYTES), b"")
        else:
            pieces = stdin
        try:
            for piece in pieces:
                for at in range(0, len(piece), STDIN_PIECE_BYTES):
                    if not self._send({"stdin": {"data": _encode_bytes(piece[at:at + STDIN_PIECE_BYTES])}}, run):
                        return
        except Exception as e:
            # Unreadable (or not bytes): the run is cancelled, never fed a
            # truncated input as if it were whole, and its caller told why.
            self._stdin_failed = e
            try:
                self._send("cancel", run)
            except OSError:
                pass
            return
        try:
            self._send("stdin_end", run)
        except OSError:
            pass

    def _receive(self) -> Json:
        line = self._lines.readline()
        if not line:
            raise PalisadeError("Unavailable", "the broker closed the connection")
        try:
            message = json.loads(line)
        except ValueError as e:
            raise PalisadeError("ProtocolError", f"not a JSON line: {e}: {line[:200]!r}") from e
        if isinstance(message, str):
            return {message: None}
        if not isinstance(message, dict):
            raise PalisadeError("ProtocolError", f"not a message: {line!r}")
        return message

    def _ask(self, message: Union[Json, str], answer: str) -> Any:
        self._send(message)
        reply = self._receive()
        if "error" in reply:
            raise PalisadeError.of(reply["error"])
        if answer not in reply:
            raise PalisadeError("ProtocolError", f"expected {answer!r}, got {reply!r}")
        return reply[answer]

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Optional[str] = None,
        workspace: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Stdin = b"",
        on_output: Optional[OutputHandler] = None,
        on_approval: Optional[ApprovalHandler] = None,
        terminal: Optional[Tuple[int, int]] = None,
        session: Optional[str] = None,
        shell: bool = False,
        **fields: Any,
    ) -> RunResult:
        """Runs `argv`; its working directory `cwd` (default: this process's)
        is the workspace unless `workspace` says otherwise. `fields` are the
        run request's other fields (`timeout_secs`, `allow_domains`,
        `profile`, `read_only`, ...: docs/protocol.md). `stdin` as bytes
        goes with the request; a binary file or an iterable of bytes is
        streamed while the command runs, from a thread, at the pace it reads
        (an iterable may wait for output first: a REPL's next line). Output
        goes to `on_output` as it comes, or is gathered in the result. A
        refusal raises PalisadeError; a run palisade ended (a deadline, a
        quota) returns, its `status` saying which. `terminal=(rows, cols)`
        runs it in a terminal of that window (protocol version 15): its
        stdin is what is typed (b"\\x03" is Ctrl-C), always streamed, its
        output all `stdout`; `resize` changes the window while it runs.
        `session=NAME` runs it in that session of yours (`start_session`,
        protocol version 16): `cwd` defaults to the session's, `stdin`
        streams and `terminal` works from version 17 (bytes and no terminal
        before), and `fields` are only the command's own (docs/protocol.md,
        "Sessions"); with `shell=True`, `argv` (a string, or words joined by
        spaces) is a line of the session's shell: the directory and the
        exported variables one line leaves, the next starts with."""
        if shell:
            if session is None:
                raise PalisadeError("InvalidRequest", "a shell line runs in a session: give session=")
            argv = shell_argv(argv if isinstance(argv, str) else " ".join(argv))
        if session is not None:
            call = (argv, cwd, env, stdin, terminal)
            return self._run_in_session(session, call, on_output, on_approval, fields)
        request: Json = {"argv": list(argv), "cwd": cwd or os.getcwd(), "raw_output": True}
        if workspace is not None:
            request["workspace"] = workspace
        if env is not None:
            request["env"] = dict(env)
        streamed: Optional[Union[BinaryIO, Iterable[bytes]]] = None
        if terminal is not None:
            if self.version < TERMINAL_VERSION:
                raise PalisadeError(
                    "ProtocolError",
                    f"this broker speaks protocol version {self.version}; a terminal needs {TERMINAL_VERSION}",
                )
            # A terminal's input always streams: bytes are what is typed first.
            streamed = [bytes(stdin)] if isinstance(stdin, (bytes, bytearray)) else stdin
        elif isinstance(stdin, (bytes, bytearray)):
            if stdin:
                request["stdin"] = _encode_bytes(bytes(stdin))
        elif self.version >= STREAMED_STDIN_VERSION:
            streamed = stdin
        else:
            # An older broker takes stdin in the request alone.
            if hasattr(stdin, "read"):
                whole = cast(BinaryIO, stdin).read()
            else:
                whole = b"".join(stdin)
            if whole:
                request["stdin"] = _encode_bytes(whole)
        request.update(fields)
        if terminal is not None:
            rows, cols = terminal
            self._send({"run_in_terminal": {"run": request, "size": {"rows": rows, "cols": cols}}})
        else:
            self._send({"run_with_stdin" if streamed is not None else "run": request})
        return self._answered(streamed, on_output, on_approval)

    def _answered(
        self,
        streamed: Optional[Union[BinaryIO, Iterable[bytes]]],
        on_output: Optional[OutputHandler],
        on_approval: Optional[ApprovalHandler],
    ) -> RunResult:
        """The messages of the run just sent, to its end; its streamed stdin fed meanwhile."""
        self._stdin_failed = None
        try:
            result = self._events(streamed, on_output, on_approval)
        except BaseException as e:
            # Ended otherwise than by the broker's answer (a broken
            # connection, an interrupt): the broker may not be reading while
            # the stdin's thread waits in a send; shutting the connection
            # down ends that wait.
            if streamed is not None and not (isinstance(e, PalisadeError) and e.reply):
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            raise
        finally:
            self._run_ended()
        if self._stdin_failed is not None:
            raise PalisadeError("RuntimeFailure", f"reading the run's stdin: {self._stdin_failed}") from self._stdin_failed
        return result

    def _run_in_session(
        self,
        session: str,
        call: Tuple[
            Sequence[str], Optional[str], Optional[Mapping[str, str]], Stdin, Optional[Tuple[int, int]]
        ],
        on_output: Optional[OutputHandler],
        on_approval: Optional[ApprovalHandler],
        fields: Dict[str, Any],
    ) -> RunResult:
        """`run(..., session=...)`: `call` is its argv, cwd, env, stdin and terminal."""
        self._needs_sessions()
        argv, cwd, env, stdin, terminal = call
        streamed: Optional[Union[BinaryIO, Iterable[bytes]]] = None
        if terminal is not None and self.version < SESSION_STDIN_VERSION:
            raise PalisadeError(
                "ProtocolError",
                f"this broker speaks protocol version {self.version}; a session's command has a "
                f"terminal from {SESSION_STDIN_VERSION}",
            )
        if terminal is not None:
            # A terminal's input always streams: bytes are what is typed first.
            streamed = [bytes(stdin)] if isinstance(stdin, (bytes, bytearray)) else stdin
        elif not isinstance(stdin, (bytes, bytearray)):
            if self.version < SESSION_STDIN_VERSION:
                raise PalisadeError(
                    "ProtocolError",
                    f"this broker speaks protocol version {self.version}; a session's command takes a "
                    f"streamed stdin from {SESSION_STDIN_VERSION} (give bytes)",
                )
            streamed = stdin
        request: Json = {"argv": list(argv), "raw_output": True}
        for name, value in (("cwd", cwd), ("env", dict(env) if env is not None else None)):
            if value is not None:
                request[name] = value
        if stdin and streamed is None:
            request["stdin"] = _encode_bytes(bytes(cast(bytes, stdin)))
        request.update(fields)
        if terminal is not None:
            rows, cols = terminal
            size = {"rows": rows, "cols": cols}
            self._send({"run_in_session_in_terminal": {"session": session, "run": request, "size": size}})
        else:
            kind = "run_in_session" if streamed is None else "run_in_session_with_stdin"
            self._send({kind: {"session": session, "run": request}})
        return self._answered(streamed, on_output, on_approval)

    def _needs_sessions(self) -> None:
        if self.version < SESSION_VERSION:
            raise PalisadeError(
                "ProtocolError", f"this broker speaks protocol version {self.version}; sessions need {SESSION_VERSION}"
            )

    def start_session(
        self,
        *,
        name: Optional[str] = None,
        cwd: Optional[str] = None,
        idle_timeout_secs: Optional[int] = None,
        max_lifetime_secs: Optional[int] = None,
        **fields: Any,
    ) -> Json:
        """Starts a session, a sandbox that stays for the commands `run(...,
        session=NAME)` runs in it; `fields` are a run request's (`profile`,
        `read_only`, `workspace`, ...) but `argv` and `stdin`. Returns it as
        `list_sessions` lists it (its `name`)."""
        self._needs_sessions()
        run: Json = {"argv": [], "cwd": cwd or os.getcwd()}
        run.update(fields)
        start: Json = {"run": run}
        for key, value in (("name", name), ("idle_timeout_secs", idle_timeout_secs),
                           ("max_lifetime_secs", max_lifetime_secs)):
            if value is not None:
                start[key] = value
        started: Json = self._ask({"start_session": start}, "session_started")
        return started

    def list_sessions(self) -> List[Json]:
        """Your live sessions (`sessions`)."""
        self._needs_sessions()
        sessions: List[Json] = self._ask("list_sessions", "sessions")
        return sessions

    def publish(self, session: str, port: int) -> str:
        """Publishes `port` of session `session`'s own loopback to you: the
        path of a Unix socket on the host, yours alone, each connection to
        which reaches the port from inside the session, until it ends."""
        if self.version < PUBLISH_VERSION:
            raise PalisadeError(
                "ProtocolError",
                f"this broker speaks protocol version {self.version}; publishing needs {PUBLISH_VERSION}",
            )
        published: Json = self._ask({"publish": {"session": session, "port": port}}, "published")
        socket: str = published["socket"]
        return socket

    def stop_session(self, name: str) -> RunResult:
        """Ends session `name`, killing everything in it: its own result,
        status "stopped" (from protocol version 20; "cancelled" before), its
        `changes` what became of the session's writes."""
        self._needs_sessions()
        finished: Json = self._ask({"stop_session": {"session": name}}, "finished")
        return _result(finished, {"stdout": [], "stderr": []}, [])

    def resize(self, rows: int, cols: int) -> bool:
        """The window of the terminal of the run in progress (`run`'s
        `terminal`): the command gets SIGWINCH. From another thread, or an
        `on_output` handler; False when no run has started and not ended
        (before `started` the broker may be asking for an approval)."""
        if not (1 <= rows <= WINDOW_MAX and 1 <= cols <= WINDOW_MAX):
            raise ValueError(f"a terminal's rows and cols are 1 to {WINDOW_MAX} (got {rows} rows, {cols} cols)")
        with self._sending:
            if not self._running:
                return False
            run = self._runs_ended
        return self._send({"resize": {"rows": rows, "cols": cols}}, run)

    def _events(
        self,
        streamed: Optional[Union[BinaryIO, Iterable[bytes]]],
        on_output: Optional[OutputHandler],
        on_approval: Optional[ApprovalHandler],
    ) -> RunResult:
        """A run's messages to its end; its streamed stdin fed from `started` on."""
        gathered: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        approvals: List[Json] = []
        while True:
            message = self._receive()
            if "output" in message:
                output = message["output"]
                if "bytes" in output:
                    data = self._lines.read(output["bytes"])
                    if len(data) != output["bytes"]:
                        raise PalisadeError("Unavailable", "the broker closed the connection in a piece of output")
                else:
                    data = _decode_bytes(output["data"])
                if on_output is not None:
                    on_output(output["stream"], data)
                else:
                    gathered[output["stream"]].append(data)
            elif "approval_required" in message:
                question = message["approval_required"]
                approvals.append(question)
                approved = bool(on_approval(question)) if on_approval is not None else False
                if question.get("may_answer"):
                    self._send({"approve": {"approved": approved}})
            elif "started" in message:
                with self._sending:
                    self._running = True
                if streamed is not None:
                    threading.Thread(target=self._feed, args=(streamed, self._runs_ended), daemon=True).start()
                    streamed = None
            elif "finished" in message:
                return _result(message["finished"], gathered, approvals)
            elif "error" in message:
                raise PalisadeError.of(message["error"])

    def explain(self, argv: Sequence[str], *, cwd: Optional[str] = None, **fields: Any) -> Json:
        """The policy's decision on `argv` without running it (`explained`)."""
        request: Json = {"argv": list(argv), "cwd": cwd or os.getcwd()}
        request.update(fields)
        explained: Json = self._ask({"explain": request}, "explained")
        return explained

    def run_plugin(self, skill: str, input: str = "{}", *, timeout_ms: Optional[int] = None) -> Json:
        """Calls an installed WebAssembly skill (`plugin_result`)."""
        call: Json = {"skill": skill, "input": input}
        if timeout_ms is not None:
            call["timeout_ms"] = timeout_ms
        result: Json = self._ask({"run_plugin": call}, "plugin_result")
        return result

    def status(self) -> Json:
        """The broker's state (`status`)."""
        status: Json = self._ask("status", "status")
        return status


def _result(finished: Json, gathered: Dict[str, List[bytes]], approvals: List[Json]) -> RunResult:
    status = finished.get("status")
    code = signal = None
    if isinstance(status, dict):
        name = next(iter(status))
        code = status[name].get("code") if name == "exited" else None
        signal = status[name].get("signal") if name == "signaled" else None
    else:
        name = str(status)
    return RunResult(
        status=name,
        code=code,
        signal=signal,
        result=finished,
        stdout=b"".join(gathered["stdout"]),
        stderr=b"".join(gathered["stderr"]),
        approvals=approvals,
    )
