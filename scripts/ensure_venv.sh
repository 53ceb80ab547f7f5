#!/bin/sh
# Create the virtualenv; on a bare Debian, python3 -m venv needs python3-venv first.
set -e
VENV="${1:-.venv}"
[ -x "$VENV/bin/python" ] && exit 0
if ! python3 -m venv "$VENV" 2>/dev/null; then
  rm -rf "$VENV"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$VENV"
  else
    echo "python3 -m venv failed: install python3-venv (Debian) and retry" >&2
    exit 1
  fi
fi
"$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip
