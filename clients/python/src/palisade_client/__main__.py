"""palisade-client: run a command, or call a plugin, through palisade's broker.

    palisade-client [--socket PATH] -- CMD [ARGS...]
    palisade-client [--socket PATH] --plugin SKILL [INPUT_JSON]

(or `python3 -m palisade_client ...`). Runs CMD with the current directory as
the workspace, streams its output (and its stdin, when that is not a
terminal or /dev/null), and exits with its status (128+N for
signal N, 125 when palisade refused or failed, 123 when the command ended
by itself but its writes did not all land: held, partly applied or
discarded). With --plugin, calls an
installed WebAssembly skill with INPUT_JSON (default {}) and prints its output.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import List, Optional

from . import EXIT_PALISADE, Client, Json, PalisadeError, Stdin


def _ask_terminal(question: Json) -> bool:
    """Puts a run that needs approval to the person at the terminal (none:
    no), or says who may answer it."""
    if not question.get("may_answer"):
        approval = question["approval"]["id"]
        print(f"palisade: {question['reason']} waiting for an approver: palisade approve {approval}",
              file=sys.stderr)
        return False
    try:
        with open("/dev/tty", "r+") as tty:
            tty.write(f"palisade: {question['reason']} [y/N] ")
            tty.flush()
            return tty.readline().strip().lower() in ("y", "yes")
    except OSError:
        return False


def _own_stdin() -> Stdin:
    """This process's stdin, to stream to the command; none when it is a
    terminal, /dev/null or closed."""
    try:
        if sys.stdin is None or sys.stdin.isatty():
            return b""
        own, null = os.fstat(0), os.stat(os.devnull)
    except (OSError, ValueError):
        return b""
    if stat.S_ISCHR(own.st_mode) and own.st_rdev == null.st_rdev:
        return b""
    return sys.stdin.buffer


def _write(stream: str, data: bytes) -> None:
    out = sys.stdout if stream == "stdout" else sys.stderr
    out.buffer.write(data)
    if out.isatty():
        out.flush()


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = None
    if args[:1] == ["--socket"] and len(args) > 1:
        path, args = args[1], args[2:]
    plugin = args[:1] == ["--plugin"] and len(args) in (2, 3)
    if not plugin and (args[:1] != ["--"] or len(args) < 2):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with Client(path) as broker:
            if plugin:
                print(broker.run_plugin(args[1], args[2] if len(args) == 3 else "{}")["output"])
                return 0
            # This process's umask, for what the command creates (read by setting it back).
            umask = os.umask(0o022)
            os.umask(umask)
            result = broker.run(args[1:], env=dict(os.environ), umask=umask, stdin=_own_stdin(),
                                on_output=_write, on_approval=_ask_terminal)
    except PalisadeError as e:
        print(f"palisade: {e.kind}: {e.message}", file=sys.stderr)
        return EXIT_PALISADE
    except OSError as e:
        print(f"palisade: Unavailable: {path or 'the broker'}: {e}", file=sys.stderr)
        return EXIT_PALISADE
    if result.code is None and result.signal is None:
        print(f"palisade: {result.status}", file=sys.stderr)
    if not result.writes_landed:
        changes = result.result.get("changes") or {}
        where = f" (change set {changes['id']})" if changes.get("id") else ""
        print(f"palisade: the run's writes did not all land: {changes.get('outcome')}{where}: "
              f"{changes.get('reason') or 'see withheld'}", file=sys.stderr)
    sys.stdout.flush()
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main())
