#!/usr/bin/env bash
# Makes target/py-venv: a Python virtual environment with the official MCP
# SDK and mypy (tests/python-requirements.txt), which the suite drives
# `palisade mcp` with (tests/tests/all/mcp.rs), and palisade's own Python
# client, installed from clients/python as a user would
# (tests/tests/all/python_client.rs). The system's python3 is preferred: the
# suite runs it as the unprivileged test user too, who may not reach a
# per-user Python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py-venv
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
if [ ! -x "$venv/bin/python3" ] || ! "$venv/bin/python3" -c 'import mcp, mypy, setuptools' 2>/dev/null; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/python-requirements.txt
fi
# pytest's wheels (pure Python), which tests/tests/all/first_hour.rs installs from
# offline when it runs docs/agents.md's first hour as written.
ls target/py-wheels/pytest-*.whl >/dev/null 2>&1 ||
  "$venv/bin/pip" download --quiet --disable-pip-version-check -d target/py-wheels pytest==8.3.3
# The client, every time: it is part of the tree under test. Built with the
# environment's setuptools (no download); a copy, not a link to the source.
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation --no-deps --force-reinstall \
  ./clients/python
rm -rf clients/python/build clients/python/src/*.egg-info
"$venv/bin/python3" -c 'import importlib.metadata as m; print("target/py-venv: mcp", m.version("mcp"), "palisade-client", m.version("palisade-client"))'
