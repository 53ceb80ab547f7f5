"""scripts/imagegen_cli.py as a newcomer runs it: with the system python3 (no Django, no torch,
no c2pa) in a bare environment, from any folder. Every subcommand answers; `verify` runs with the
checkout's packages or says in one line what to run instead; with `make run` going and no token
given it takes the URL and the token from var/run-info.txt (IMAGEGEN_VAR_DIR's when set); a bad
--size is reported as `size`, locally or from the server's 400."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from jobs.media import credentials
from jobs.media.encoding import encode
from scripts.run import info_block
from tests.test_content_credentials import PARAMS, picture

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "scripts" / "imagegen_cli.py"
PROMPT = "a red circle on a blue background"
SUBCOMMANDS = ("submit", "watch", "get", "download", "verify")
# The interpreter the README's `python3 scripts/imagegen_cli.py` finds on a fresh machine: none of
# the project's packages. Where there is no /usr/bin/python3, the base interpreter without site-packages.
SYSTEM_PYTHON = (["/usr/bin/python3"] if Path("/usr/bin/python3").exists()
                 else [str(Path(sys.base_prefix) / "bin" / "python3"), "-S"])


def bare_env(var: Path, **extra: str) -> dict:
    """A bare environment (what `env -i` leaves, plus a var folder of the test's own)."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(var.parent), "IMAGEGEN_VAR_DIR": str(var), **extra}


def cli(*args: str, env: dict, cwd: Path, script: Path = CLI, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([*SYSTEM_PYTHON, str(script), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.integration  # starts a process of its own
def test_the_system_python_has_none_of_the_projects_packages(tmp_path):
    """What the tests below stand on: the interpreter they use cannot import Django."""
    probe = subprocess.run([*SYSTEM_PYTHON, "-c", "import django"], env=bare_env(tmp_path / "var"),
                           cwd=tmp_path, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'django'" in probe.stderr


@pytest.mark.integration  # starts processes of its own
def test_every_subcommand_answers_help_under_the_system_python(tmp_path):
    env = bare_env(tmp_path / "var")
    for args in ([], *([name] for name in SUBCOMMANDS)):
        answer = cli(*args, "--help", env=env, cwd=tmp_path)
        assert answer.returncode == 0 and answer.stdout.startswith("usage: imagegen_cli.py"), (args, answer.stderr)


@pytest.mark.integration  # starts processes of its own
@pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                    reason="the suite runs outside the checkout's .venv (what `make install` makes)")
def test_verify_under_the_system_python_runs_with_the_checkouts_packages(tmp_path):
    signed = tmp_path / "signed.png"
    encoded, _ = credentials.credentialed(encode(picture(), "png", None, PARAMS), "png", PARAMS)
    signed.write_bytes(encoded.data)
    # No --trust: the embedded root of IMAGEGEN_VAR_DIR (the test settings' var folder) is trusted.
    env = bare_env(Path(settings.VAR_DIR))
    checked = cli("verify", str(signed), "--json", env=env, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["state"] == "Trusted" and report["parameters"]["jobId"] == PARAMS.job_id
    # Another var folder has another root: the same file's signer is not trusted (exit 2).
    untrusted = cli("verify", str(signed), env=bare_env(tmp_path / "var"), cwd=tmp_path)
    assert untrusted.returncode == 2 and "signer not trusted" in untrusted.stdout, untrusted.stdout + untrusted.stderr


@pytest.mark.integration  # starts processes of its own
def test_verify_without_the_projects_packages_says_in_one_line_what_to_run(tmp_path):
    # The script alone, as if copied out of a checkout that has no .venv: nothing to run it with.
    copy = tmp_path / "checkout" / "scripts" / "imagegen_cli.py"
    copy.parent.mkdir(parents=True)
    shutil.copy(CLI, copy)
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    answer = cli("verify", "picture.png", env=bare_env(tmp_path / "var"), cwd=tmp_path, script=copy)
    assert answer.returncode == 1 and answer.stdout == ""
    lines = answer.stderr.splitlines()
    assert len(lines) == 1, answer.stderr
    # Paths as typed from the current folder.
    assert "run `make -C checkout install-run`, then" in lines[0], lines[0]
    assert "`checkout/.venv/bin/python checkout/scripts/imagegen_cli.py verify picture.png`" in lines[0], lines[0]


@pytest.mark.integration  # starts processes of its own
@pytest.mark.parametrize("size", ["500x", "abc", "0x0", "64x-64", "x64", "64x64x64"])
def test_a_size_that_is_not_width_by_height_is_reported_as_size(tmp_path, size):
    # No server: refused before any request (the URL answers nothing).
    answer = cli("--url", "http://127.0.0.1:9", "--token", "t", "submit", PROMPT, f"--size={size}",
                 env=bare_env(tmp_path / "var"), cwd=tmp_path)
    assert answer.returncode == 2, answer.stderr
    last = answer.stderr.strip().splitlines()[-1]
    assert "--size" in last and repr(size) in last and "width" not in last and "cannot reach" not in last, last


@pytest.mark.integration  # starts processes of its own
def test_without_a_token_or_run_info_the_cli_says_how_to_get_one(tmp_path):
    answer = cli("get", "00000000-0000-0000-0000-000000000000", env=bare_env(tmp_path / "var"), cwd=tmp_path)
    assert answer.returncode == 1
    lines = answer.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("no API token") and "make run" in lines[0], answer.stderr


@pytest.mark.django_db(transaction=True)
def test_with_make_run_going_the_cli_reads_the_url_and_token_from_run_info(daphne_server, workers, alice, tmp_path):
    # What `make run` writes once the service is ready (scripts/run.py), here for the live server
    # and a real token of the test database.
    var = tmp_path / "var"
    var.mkdir()
    (var / "run-info.txt").write_text(info_block(str(daphne_server.port), alice.auth_token.key, var, False) + "\n")
    env = bare_env(var)

    submitted = cli("submit", PROMPT, "--size", "64x96", "--seed", "11", env=env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    watched = cli("watch", job_id, env=env, cwd=tmp_path)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    downloaded = cli("download", job_id, "-o", "out/", env=env, cwd=tmp_path)  # the README's line, as written
    assert downloaded.returncode == 0, downloaded.stderr
    saved = tmp_path / downloaded.stdout.strip()
    assert saved.parent == tmp_path / "out" and saved.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A size the server's menu lacks: its 400 names width or height; the CLI reports `size`.
    refused = cli("submit", PROMPT, "--size", "4096x4096", env=env, cwd=tmp_path)
    assert refused.returncode == 1 and "HTTP 400" in refused.stderr and "size menu" in refused.stderr
    assert '"size"' in refused.stderr and "width" not in refused.stderr and "height" not in refused.stderr, refused.stderr

    # The flag and the environment still win over the file; run-info's token goes only to its own URL.
    elsewhere = cli("--url", "http://127.0.0.1:9", "get", job_id, env=env, cwd=tmp_path)
    assert elsewhere.returncode == 1 and elsewhere.stderr.startswith("no API token for http://127.0.0.1:9"), elsewhere.stderr
    wrong = cli("get", job_id, env={**env, "IMAGEGEN_TOKEN": "not-a-token"}, cwd=tmp_path)
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr, wrong.stderr
