#!/usr/bin/env bash
# Makes target/mcp-venv: a Python virtual environment with the official MCP
# SDK (tests/mcp/requirements.txt), which tests/tests/all/mcp.rs drives
# `palisade mcp` with. The system's python3 is preferred: the suite runs it
# as the unprivileged test user too, who may not reach a per-user Python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/mcp-venv
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
if [ ! -x "$venv/bin/python3" ] || ! "$venv/bin/python3" -c 'import mcp' 2>/dev/null; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp/requirements.txt
fi
"$venv/bin/python3" -c 'import importlib.metadata as m; print("target/mcp-venv: mcp", m.version("mcp"))'
