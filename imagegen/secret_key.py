"""The embedded default's secret key: generated once per installation and kept in the var
folder (mode 0600), so sessions, CSRF tokens and password-reset links survive restarts and no
two installations share a key. Production sets DJANGO_SECRET_KEY instead."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FILENAME = "secret_key"


def installation_secret_key(var_dir: Path) -> str:
    """The key in var_dir/secret_key, written first if missing. Every process that starts at
    once (web and workers) reads the same key: the file is written aside and linked into
    place, which fails if another process got there first, so it is never seen half-written."""
    path = var_dir / FILENAME
    for _ in range(20):
        try:
            key = path.read_text().strip()
        except FileNotFoundError:
            var_dir.mkdir(parents=True, exist_ok=True)
            draft = var_dir / f".{FILENAME}.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(50) + "\n")
            try:
                os.link(draft, path)
            except FileExistsError:
                pass
            finally:
                draft.unlink()
            continue
        if key:
            return key
    raise RuntimeError(f"could not read or create the secret key in {path}")
