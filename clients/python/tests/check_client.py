"""Drives a real broker through palisade_client's API (the suite runs it:
tests/tests/all/python_client.rs). Usage: check_client.py SOCKET WORKSPACE,
where the broker's profile `sh` allows interpreters and inline code and its
default profile does not. Prints one line per check and exits 0 when every
check held."""

import io
import itertools
import json
import os
import queue
import socket
import sys
import tempfile
import threading
import time
from typing import Iterator, List, Optional, Tuple

from palisade_client import OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION, Client, PalisadeError


def twelve_only(path: str) -> None:
    """A broker of version 12 as it greets: any other version refused, no
    range known; two connections."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()

    def serve() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with conn, conn.makefile("rb") as lines:
                hello = json.loads(lines.readline())["hello"]
                if hello["version"] != 12 or "min_version" in hello:
                    error = {"kind": "ProtocolError", "message": f"protocol version {hello['version']} is not supported; this broker speaks 12"}
                    conn.sendall(json.dumps({"error": error}).encode() + b"\n")
                else:
                    conn.sendall(b'{"hello": {"version": 12, "broker": "palisaded 0.0.12", "encoding": "json"}}\n')
        server.close()

    threading.Thread(target=serve, daemon=True).start()


def fetch_over(path: str) -> bytes:
    """An HTTP GET of / over the Unix socket at `path`, retried for 10 s
    while the server behind it is not listening yet: its reply."""
    import time

    deadline = time.monotonic() + 10
    while True:
        reply = b""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(path)
            try:
                s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                reply = b"".join(iter(lambda: s.recv(65536), b""))
            except (ConnectionResetError, BrokenPipeError):
                pass  # closed unserved (before or after the request was sent): nothing listens yet
        if reply or time.monotonic() > deadline:
            return reply
        time.sleep(0.1)


def main() -> int:
    socket_path, workspace = sys.argv[1], sys.argv[2]
    os.chdir(workspace)
    with open("data.bin", "wb") as f:
        f.write(b"a\x00\xffb\n")
    with Client(socket_path) as broker:
        assert broker.version == PROTOCOL_VERSION, broker.version
        assert broker.broker.startswith("palisaded "), broker.broker
        print("hello", broker.version, broker.broker)

        result = broker.run(["/bin/sh", "-c", "cat data.bin; echo err >&2; exit 3"], profile="sh")
        assert (result.status, result.code, result.exit_status) == ("exited", 3, 3), result
        assert (result.stdout, result.stderr) == (b"a\x00\xffb\n", b"err\n"), result
        assert result.result["attestation"]["executor"].startswith("linux"), result.result
        assert result.approved is None and result.result["approved"] is None, result.result
        print("run: exit 3, bytes and stderr gathered")

        pieces: List[Tuple[str, bytes]] = []
        streamed = broker.run(["/bin/cat"], stdin=b"fed\x01in", on_output=lambda s, b: pieces.append((s, b)))
        assert streamed.exit_status == 0 and b"".join(b for _, b in pieces) == b"fed\x01in", (streamed, pieces)
        assert streamed.stdout == b"", streamed
        print("run: stdin in, output streamed")

        # A REPL through a streamed stdin: each line is sent once the
        # output of the one before has come back.
        lines: "queue.Queue[Optional[bytes]]" = queue.Queue()
        script = [b"echo one\n", b"echo $((6 * 7))\n", b"exit 5\n"]
        lines.put(script[0])
        heard: List[bytes] = []

        def answer(stream: str, data: bytes) -> None:
            heard.append(data)
            said = b"".join(heard)
            if said == b"one\n":
                lines.put(script[1])
            elif said == b"one\n42\n":
                lines.put(script[2])
                lines.put(None)

        repl = broker.run(["/bin/sh"], profile="sh", stdin=iter(lines.get, None), on_output=answer)
        assert (repl.code, b"".join(heard)) == (5, b"one\n42\n"), (repl, heard)
        print("run: a shell driven line by line through a streamed stdin")

        # A terminal: its window read, then resized (SIGWINCH), and Ctrl-C
        # typed into it (SIGINT to its foreground process group).
        loop = "echo ready; while :; do sleep 0.05; done"
        said: List[bytes] = []

        def resize_when_ready(stream: str, data: bytes) -> None:
            said.append(data)
            if b"ready" in data:
                assert broker.resize(40, 132)

        sized = broker.run(["/bin/sh", "-c", f"trap 'stty size; exit 7' WINCH; stty size; {loop}"],
                           profile="sh", terminal=(24, 80), on_output=resize_when_ready)
        out = b"".join(said)
        assert sized.code == 7 and out.startswith(b"24 80\r\n") and b"40 132\r\n" in out, (sized, out)
        keys: "queue.Queue[Optional[bytes]]" = queue.Queue()

        def interrupt_when_ready(stream: str, data: bytes) -> None:
            if b"ready" in data:
                keys.put(b"\x03")
                keys.put(None)

        interrupted = broker.run(["/bin/sh", "-c", f"trap 'echo got-INT; exit 9' INT; {loop}"], profile="sh",
                                 terminal=(24, 80), stdin=iter(keys.get, None), on_output=interrupt_when_ready)
        assert interrupted.code == 9, interrupted
        assert not broker.resize(10, 10), "a resize with no run in progress"
        print("run: a terminal's window, a resize and Ctrl-C")
        big = 8 << 20
        counted = broker.run(["/usr/bin/wc", "-c"], stdin=io.BytesIO(b"x" * big))
        assert counted.stdout.strip() == str(big).encode(), counted
        print("run: a streamed stdin of", big, "bytes")
        # A run that ends while its stdin still streams: nothing of it
        # reaches the next run on the connection.
        for _ in range(3):
            assert broker.run(["/bin/true"], stdin=itertools.repeat(b"y" * 65536)).exit_status == 0
            assert broker.run(["/bin/cat"], stdin=b"its own").stdout == b"its own"
        print("run: an endless stdin stops with its run")

        def failing() -> Iterator[bytes]:
            yield b"begin\n"
            raise OSError("the disk went away")

        try:
            broker.run(["/bin/cat"], stdin=failing())
            raise AssertionError("a run whose stdin failed was passed off as whole")
        except PalisadeError as e:
            assert e.kind == "RuntimeFailure" and "the disk went away" in e.message, e
        assert broker.run(["/bin/true"]).exit_status == 0
        print("run: a stdin that cannot be read cancels the run")

        timed = broker.run(["/bin/sleep", "30"], timeout_secs=1)
        assert (timed.status, timed.exit_status) == ("timed_out", 125), timed
        print("run: timed_out at its deadline")

        try:
            broker.run(["/bin/true"], timeout_secs=10**9)
            raise AssertionError("a timeout above the policy's ran")
        except PalisadeError as e:
            assert (e.kind, e.rule) == ("CapabilityDenied", "request.widens"), e.reply
            print("refused:", e.rule)

        explained = broker.explain(["python3", "-c", "1"])
        assert explained["decision"] == "deny" and explained["rule"], explained
        print("explain:", explained["rule"])

        session = broker.start_session(name="py", profile="sh", idle_timeout_secs=60)
        assert (session["name"], session["runs"]) == ("py", 0), session
        broker.run(["/bin/sh", "-c", "echo kept > note.txt"], session="py")
        assert broker.run(["/bin/cat", "note.txt"], session="py").stdout == b"kept\n"
        assert [(s["name"], s["runs"]) for s in broker.list_sessions()] == [("py", 2)]
        port = 20000 + os.getpid() % 20000
        served = f"exec /usr/bin/python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &"
        broker.run(["/bin/sh", "-c", served], session="py")
        published = broker.publish("py", port)
        assert broker.publish("py", port) == published
        assert fetch_over(published).startswith(b"HTTP/1.0 200"), published
        print("session: a file one command wrote, read by the next; a server reached through", "its socket")
        broker.run("mkdir -p deep && cd deep && export KEPT=1", session="py", shell=True)
        assert broker.run("echo ${PWD##*/} $KEPT", session="py", shell=True).stdout == b"deep 1\n"
        assert broker.run(["/bin/sh", "-c", "echo ${KEPT-none}"], session="py").stdout == b"none\n"
        streamed = broker.run(["/bin/cat"], session="py", stdin=iter([b"in ", b"pieces"]))
        assert streamed.stdout == b"in pieces", streamed
        in_tty = broker.run(["/bin/sh", "-c", "stty size; tty"], session="py", terminal=(30, 100))
        assert in_tty.stdout.startswith(b"30 100\r\n/dev/pts/"), in_tty.stdout
        print("session: a shell line's directory and exports, the next's")
        stopped = broker.stop_session("py")
        assert (stopped.status, stopped.result["run_id"]) == ("stopped", session["run_id"]), stopped
        assert (stopped.writes_landed, stopped.exit_status) == (True, 0), stopped.result["changes"]
        assert broker.list_sessions() == []
        try:
            broker.run(["/bin/true"], session="py")
            raise AssertionError("a command ran in a stopped session")
        except PalisadeError as e:
            assert (e.kind, e.rule) == ("InvalidRequest", "session.unknown"), e.reply
        assert not os.path.exists(published), published
        print("session: stopped, its socket gone")

        # The last sandbox's teardown may follow its answer by a moment.
        deadline = time.monotonic() + 10
        status = broker.status()
        while status["runs_in_flight"] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            status = broker.status()
        assert status["protocol"] == PROTOCOL_VERSION and status["runs_in_flight"] == 0, status
        operations = status["operations"]
        assert operations["runs"] == [] and operations["socket"].endswith(".sock"), operations
        print("status: protocol", status["protocol"])

    # A client of the previous version only is still served, in that version.
    import palisade_client

    palisade_client.PROTOCOL_VERSION = OLDEST_PROTOCOL_VERSION
    with Client(socket_path) as old:
        assert old.version == OLDEST_PROTOCOL_VERSION, old.version
        assert old.run(["/bin/echo", "old"]).stdout == b"old\n"
        try:
            old.run(["/bin/true"], terminal=(24, 80))
            raise AssertionError("a terminal asked of version 12")
        except PalisadeError as e:
            assert e.kind == "ProtocolError" and "a terminal needs 15" in e.message, e
        try:
            old.publish("py", 1)
            raise AssertionError("a port published in version 12")
        except PalisadeError as e:
            assert e.kind == "ProtocolError" and "publishing needs 17" in e.message, e
        try:
            old.start_session()
            raise AssertionError("a session asked of version 12")
        except PalisadeError as e:
            assert e.kind == "ProtocolError" and "sessions need 16" in e.message, e
        # No streamed stdin before version 14: it goes whole, in the request.
        assert old.run(["/bin/cat"], stdin=iter([b"whole ", b"stdin"])).stdout == b"whole stdin"
        print("version", old.version, "still served")
    palisade_client.PROTOCOL_VERSION = PROTOCOL_VERSION
    # A broker of version 12, which knows no range: asked again in 12 alone.
    with tempfile.TemporaryDirectory() as d:
        twelve_only(os.path.join(d, "s"))
        with Client(os.path.join(d, "s")) as twelve:
            assert (twelve.version, twelve.broker) == (12, "palisaded 0.0.12"), twelve.version
            print("a broker of version 12 is met in 12")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
