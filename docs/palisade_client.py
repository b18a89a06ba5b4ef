#!/usr/bin/env python3
"""A minimal palisade client over the JSON-lines encoding (standard library only).

    python3 palisade_client.py [--socket PATH] -- CMD [ARGS...]
    python3 palisade_client.py [--socket PATH] --plugin SKILL [INPUT_JSON]

Runs CMD through palisaded with the current directory as the workspace,
streams its output, and exits with its status (128+N for signal N, 125 when
palisade refused or failed). With --plugin, calls an installed WebAssembly
skill with INPUT_JSON (default {}) and prints its output.
"""
import base64
import json
import os
import socket
import sys


def default_socket():
    if os.geteuid() == 0:
        return "/run/palisade/palisade.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{os.geteuid()}")
    return os.path.join(runtime, "palisade", "palisade.sock")


def ask(reason):
    """Puts a run that needs approval to the person at the terminal; none: no."""
    try:
        with open("/dev/tty", "r+") as tty:
            tty.write(f"palisade: {reason} [y/N] ")
            tty.flush()
            return tty.readline().strip().lower() in ("y", "yes")
    except OSError:
        return False


def main(argv):
    path = os.environ.get("PALISADE_SOCKET") or default_socket()
    if argv[:1] == ["--socket"]:
        path, argv = argv[1], argv[2:]
    plugin = argv[:1] == ["--plugin"] and len(argv) in (2, 3)
    if not plugin and (argv[:1] != ["--"] or len(argv) < 2):
        print(__doc__, file=sys.stderr)
        return 2
    command = argv[1:]

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    lines = sock.makefile("rb", buffering=1 << 20)

    def send(message):
        sock.sendall(json.dumps(message).encode() + b"\n")

    def receive():
        line = lines.readline()
        if not line:
            raise EOFError("the broker closed the connection")
        return json.loads(line)

    send({"hello": {"magic": "palisade", "version": 12, "encoding": "json"}})
    reply = receive()
    if "error" in reply:
        print(f"palisade: {reply['error']['kind']}: {reply['error']['message']}", file=sys.stderr)
        return 125
    if plugin:
        send({"run_plugin": {"skill": argv[1], "input": argv[2] if len(argv) == 3 else "{}"}})
        message = receive()
        if "plugin_result" in message:
            print(message["plugin_result"]["output"])
            return 0
        print(f"palisade: {message['error']['kind']}: {message['error']['message']}", file=sys.stderr)
        return 125
    # This process's umask, for what the command creates (read by setting it back).
    umask = os.umask(0o022)
    os.umask(umask)
    # raw_output: each piece of output follows its line as raw bytes.
    run = {"argv": command, "cwd": os.getcwd(), "env": dict(os.environ), "raw_output": True, "umask": umask}
    send({"run": run})
    while True:
        message = receive()
        if "output" in message:
            stream = sys.stdout if message["output"]["stream"] == "stdout" else sys.stderr
            output = message["output"]
            if "bytes" in output:
                data = lines.read(output["bytes"])
            elif isinstance(output["data"], str):
                data = output["data"].encode()  # text
            else:
                data = base64.b64decode(output["data"]["base64"])
            stream.buffer.write(data)
            if stream.isatty():
                stream.flush()
        elif "approval_required" in message:
            question = message["approval_required"]
            if question["may_answer"]:
                send({"approve": {"approved": ask(question["reason"])}})
            else:
                approval = question["approval"]["id"]
                print(f"palisade: {question['reason']} waiting for an approver: palisade approve {approval}",
                      file=sys.stderr)
        elif "finished" in message:
            status = message["finished"]["status"]
            if "exited" in status:
                return status["exited"]["code"]
            if "signaled" in status:
                return 128 + status["signaled"]["signal"]
            print(f"palisade: {status}", file=sys.stderr)
            return 125
        elif "error" in message:
            print(f"palisade: {message['error']['kind']}: {message['error']['message']}", file=sys.stderr)
            return 125


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
