"""Drives a real broker through palisade_client's API (the suite runs it:
tests/tests/all/python_client.rs). Usage: check_client.py SOCKET WORKSPACE,
where the broker's profile `sh` allows interpreters and inline code and its
default profile does not. Prints one line per check and exits 0 when every
check held."""

import os
import sys
from typing import List, Tuple

from palisade_client import OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION, Client, PalisadeError


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
        print("run: exit 3, bytes and stderr gathered")

        pieces: List[Tuple[str, bytes]] = []
        streamed = broker.run(["/bin/cat"], stdin=b"fed\x01in", on_output=lambda s, b: pieces.append((s, b)))
        assert streamed.exit_status == 0 and b"".join(b for _, b in pieces) == b"fed\x01in", (streamed, pieces)
        assert streamed.stdout == b"", streamed
        print("run: stdin in, output streamed")

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

        status = broker.status()
        assert status["protocol"] == PROTOCOL_VERSION and status["runs_in_flight"] == 0, status
        print("status: protocol", status["protocol"])

    # A client of the previous version only is still served, in that version.
    import palisade_client

    palisade_client.PROTOCOL_VERSION = OLDEST_PROTOCOL_VERSION
    with Client(socket_path) as old:
        assert old.version == OLDEST_PROTOCOL_VERSION, old.version
        assert old.run(["/bin/echo", "old"]).stdout == b"old\n"
        print("version", old.version, "still served")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
