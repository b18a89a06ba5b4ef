"""Which socket the client goes to, in palisade's one order, without a
broker: listening sockets stand in for brokers. Run by
tests/tests/all/python_client.rs with the Rust constants of the system
sockets as arguments:

    check_discovery.py LINUX_SYSTEM_SOCKET MACOS_SYSTEM_SOCKET
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import tempfile
from typing import Callable, List

import palisade_client


def listen(path: str) -> socket.socket:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    return server


def on(platform: str) -> None:
    """The module as it is on `platform` (sys.platform's value there)."""
    setattr(sys, "platform", platform)
    importlib.reload(palisade_client)


def main() -> int:
    linux, macos = sys.argv[1], sys.argv[2]
    real_platform, real_geteuid = sys.platform, os.geteuid
    # Not root (whose own socket is the system one): this user, or as root
    # another uid, whose private directory root can give it.
    uid = os.getuid() or 4242
    as_user: Callable[[], int] = lambda: uid
    setattr(os, "geteuid", as_user)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("PALISADE_SOCKET", "PALISADE_SYSTEM_CONFIG", "XDG_RUNTIME_DIR"):
            os.environ.pop(name, None)
        os.environ["TMPDIR"] = tmp

        # The system socket, per system, as the Rust side's.
        on("linux")
        assert palisade_client.SYSTEM_SOCKET == linux, palisade_client.SYSTEM_SOCKET
        on("darwin")
        assert palisade_client.SYSTEM_SOCKET == macos, palisade_client.SYSTEM_SOCKET
        os.environ["PALISADE_SYSTEM_CONFIG"] = os.path.join(tmp, "none.toml")
        assert palisade_client.system_socket() == macos
        assert palisade_client.own_socket() == os.path.join(tmp, "palisade", "palisade.sock")
        print("macOS: the LaunchDaemon's socket is the system socket")

        # macOS: the user's own, then the system broker's (configured here).
        system = os.path.join(tmp, "system", "palisade.sock")
        config = os.path.join(tmp, "palisade.toml")
        with open(config, "w") as f:
            f.write(f'[broker]\nallowed_gids = ["palisade"]\n[clients]\nsystem_socket = "{system}"\n')
        os.environ["PALISADE_SYSTEM_CONFIG"] = config
        own = palisade_client.own_socket()
        assert palisade_client.default_socket() == own, "nothing listens: the user's own is named"
        servers: List[socket.socket] = [listen(system)]
        assert palisade_client.default_socket() == system, "the system broker, when it alone listens"
        servers.append(listen(own))
        assert palisade_client.default_socket() == own, "the user's own first"
        print("macOS: the user's own, then the system broker")

        # Linux: the runtime directory's, then the system broker's; a socket
        # nobody listens on is passed over.
        on("linux")
        runtime = os.path.join(tmp, "runtime")
        os.environ["XDG_RUNTIME_DIR"] = runtime
        own = palisade_client.own_socket()
        assert own == os.path.join(runtime, "palisade", "palisade.sock"), own
        assert palisade_client.default_socket() == system
        stale = listen(own)
        stale.close()
        assert os.path.exists(own)
        assert palisade_client.default_socket() == system, "a socket nobody listens on is nothing there"
        os.unlink(own)
        servers.append(listen(own))
        assert palisade_client.default_socket() == own
        os.environ["PALISADE_SOCKET"] = "/named.sock"
        assert palisade_client.default_socket() == "/named.sock", "$PALISADE_SOCKET first"
        del os.environ["PALISADE_SOCKET"]
        # Without a runtime directory: the private palisade-UID of $TMPDIR,
        # trusted only while it is closed to others.
        del os.environ["XDG_RUNTIME_DIR"]
        private = os.path.join(tmp, f"palisade-{uid}")
        if not os.path.isdir(f"/run/user/{uid}"):
            fallback = palisade_client.own_socket()
            assert fallback == os.path.join(private, "palisade.sock"), fallback
            os.mkdir(private, 0o700)
            if os.getuid() == 0:
                os.chown(private, uid, -1)
            servers.append(listen(fallback))
            assert palisade_client.default_socket() == fallback
            os.chmod(private, 0o755)
            assert palisade_client.default_socket() == system, "a palisade-UID open to others is not trusted"
        # Root's own is the system socket.
        uid = 0
        assert palisade_client.own_socket() == linux
        print("Linux: $PALISADE_SOCKET, the user's own, then the system broker")
        for server in servers:
            server.close()

    setattr(sys, "platform", real_platform)
    setattr(os, "geteuid", real_geteuid)
    importlib.reload(palisade_client)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
