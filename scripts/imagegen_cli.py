#!/usr/bin/env python3
"""A small command-line client for the imagegen native API (standard library only).

    imagegen_cli.py submit "a red circle on a blue background" --size 64x64 --seed 7   # prints the job id
    imagegen_cli.py watch JOB_ID          # follows the job's server-sent events until it ends
    imagegen_cli.py download JOB_ID -o out/   # saves the job's images as PNG files
    imagegen_cli.py get JOB_ID            # the job's JSON
    imagegen_cli.py verify FILE [--trust ROOTS.pem] [--json]   # the file's content credentials (C2PA)

Runs with a bare python3 (the system's): the standard library only, `verify` aside.
The server and the API token come from --url / --token, else IMAGEGEN_URL / IMAGEGEN_TOKEN, else
the block `make run` writes to var/run-info.txt (IMAGEGEN_VAR_DIR/run-info.txt when that is set;
its token is sent to its own URL only), else the URL http://127.0.0.1:8000 and no token. Get a
token with `.venv/bin/python manage.py issue_token USER`.
Exit status: 0 on success; 1 on an HTTP or connection error (a 400 about the width or height of
a --size is reported as `size`); 2 on a bad argument (a --size that is not WIDTHxHEIGHT); for
`watch`, 2 when the job ends in a status other than done; for `verify`, 2 when the signature is
intact but its signer is not among the trusted roots, 3 when the file has no manifest or it does
not verify.

`verify` needs no server and no token, but the project's packages (c2pa-python's reader checks
the manifest's signature, its binding to the file's bytes and its certificate chain): a python3
without them runs it again with this checkout's .venv/bin/python, or, with no .venv, says in one
line what to run. It trusts --trust, IMAGEGEN_C2PA_TRUST_ANCHORS or the checkout's embedded root
(var/c2pa/root.pem, under IMAGEGEN_VAR_DIR when set).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"
ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
SIZE = re.compile(r"(\d+)x(\d+)")


class ApiError(Exception):
    """An HTTP error answer (status, its decoded body) or, with status 0, no answer at all."""

    def __init__(self, status: int, payload: object, retry_after: str | None = None):
        super().__init__(status, payload)
        self.status, self.payload, self.retry_after = status, payload, retry_after

    def __str__(self) -> str:
        if not self.status:
            return str(self.payload)
        message = f"HTTP {self.status}"
        payload = self.payload
        if isinstance(payload, dict) and set(payload) - {"detail"}:
            message += f": {json.dumps(payload)}"
        elif isinstance(payload, dict):
            message += f": {payload['detail']}"
        elif payload:
            message += f": {payload}"
        if self.retry_after:
            message += f" (retry after {self.retry_after} s)"
        return message

    def fields_renamed(self, names: dict[str, str]) -> ApiError:
        """The same error with its field errors under other names (several may merge into one)."""
        if self.status != 400 or not isinstance(self.payload, dict) or not set(self.payload) & set(names):
            return self
        renamed: dict = {}
        for field, errors in self.payload.items():
            bucket = renamed.setdefault(names.get(field, field), [])
            for error in errors if isinstance(errors, list) else [errors]:
                if error not in bucket:
                    bucket.append(error)
        return ApiError(self.status, renamed, self.retry_after)


class Client:
    def __init__(self, base_url: str, token: str | None, timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def absolute(self, url: str) -> str:
        return urllib.parse.urljoin(self.base_url + "/", url)

    def _request(self, method: str, path: str, body: dict | None = None, auth: bool = True, accept: str = "application/json"):
        headers = {"Accept": accept, "User-Agent": "imagegen-cli/1"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if auth and self.token:
            headers["Authorization"] = f"Token {self.token}"
        request = urllib.request.Request(self.absolute(path), data=data, headers=headers, method=method)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise http_error(exc) from None
        except urllib.error.URLError as exc:
            raise ApiError(0, f"cannot reach {self.base_url}: {exc.reason}") from None

    def json(self, method: str, path: str, body: dict | None = None) -> dict:
        with self._request(method, path, body) as response:
            return json.loads(response.read() or b"null")

    def submit(self, body: dict) -> dict:
        return self.json("POST", "/api/v1/jobs", body)

    def job(self, job_id: str) -> dict:
        return self.json("GET", f"/api/v1/jobs/{job_id}")

    def events(self, job_id: str):
        """Yield the job's events (dicts) from the SSE stream until the server ends it."""
        response = self._request("GET", f"/api/v1/jobs/{job_id}/events", accept="text/event-stream")
        with response:
            data_lines: list[str] = []
            for raw in response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line == "":
                    if data_lines:
                        yield json.loads("\n".join(data_lines))
                        data_lines = []
                elif line.startswith(":"):
                    continue  # keepalive comment
                elif line.startswith("data:"):
                    data_lines.append(line[5:].lstrip(" "))
                # `event:` lines repeat the JSON's "type"; nothing else is sent.

    def fetch(self, url: str) -> bytes:
        # Image URLs are public and immutable: no token (and none leaks to a bucket's host).
        with self._request("GET", url, auth=False, accept="image/*") as response:
            return response.read()


def http_error(exc: urllib.error.HTTPError) -> ApiError:
    body = exc.read()
    try:
        payload = json.loads(body)
    except ValueError:
        payload = body.decode("utf-8", "replace")[:300]
    return ApiError(exc.code, payload, exc.headers.get("Retry-After"))


def describe_event(event: dict) -> str:
    kind = event.get("type")
    if kind == "progress":
        return f"progress {event.get('step')}/{event.get('total')}"
    if kind == "preview":
        image = event.get("image", "")
        size = len(image.split(",", 1)[-1]) * 3 // 4 if image else 0
        return f"preview at step {event.get('step')} (JPEG, about {size} bytes)"
    if kind == "status":
        text = f"status {event.get('status')}"
        if event.get("reason"):
            text += f": {event['reason']}"
        for image in event.get("images") or []:
            text += f"\n  image {image.get('index')} seed {image.get('seed')} {image.get('width')}x{image.get('height')}: {image.get('url')}"
        return text
    return json.dumps(event)


def parse_size(text: str) -> tuple[int, int]:
    """WIDTHxHEIGHT in pixels; whether the server's size menu has it is the server's to say."""
    match = SIZE.fullmatch(text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT in pixels (for example 64x64)")
    width, height = int(match[1]), int(match[2])
    if not width or not height:
        raise argparse.ArgumentTypeError(f"{text!r}: each side is at least 1 pixel")
    return width, height


def cmd_submit(client: Client, args) -> int:
    body: dict = {"prompt": args.prompt, "count": args.count}
    if args.size:
        body["width"], body["height"] = args.size
    for name in ("negative_prompt", "steps", "seed", "guidance_scale"):
        value = getattr(args, name)
        if value is not None:
            body[name] = value
    try:
        job = client.submit(body)
    except ApiError as exc:
        # The API takes the size as width and height; the user gave it as --size.
        raise (exc.fields_renamed({"width": "size", "height": "size"}) if args.size else exc) from None
    print(job["id"])
    return 0


def cmd_watch(client: Client, args) -> int:
    final = None
    for event in client.events(args.job_id):
        print(describe_event(event), flush=True)
        if event.get("type") == "status":
            final = event.get("status")
    return 0 if final == "done" else 2


def cmd_get(client: Client, args) -> int:
    print(json.dumps(client.job(args.job_id), indent=2))
    return 0


def cmd_download(client: Client, args) -> int:
    job = client.job(args.job_id)
    if job["status"] != "done":
        print(f"job {job['id']} is {job['status']}; only a done job has images", file=sys.stderr)
        return 2
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for image in job["images"]:
        extension = image["url"].rsplit(".", 1)[-1] if "." in image["url"].rsplit("/", 1)[-1] else "png"  # png, jpeg, webp
        path = out / f"{job['id']}-{image['index']}.{extension}"
        path.write_bytes(client.fetch(image["url"]))
        print(path)
    return 0


def shown(path: Path) -> str:
    """A path as it can be typed from the current folder."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def var_dir() -> Path:
    """The checkout's var folder, as the service's settings and `make run` find it."""
    return Path(os.environ.get("IMAGEGEN_VAR_DIR") or ROOT / "var")


def with_project_packages(argv: list[str], missing: ImportError) -> int:
    """Run this command again with the checkout's .venv python (what `make run` installs), or
    say in one line what to run when there is none (or it lacks the packages too)."""
    if VENV_PYTHON.exists() and os.path.abspath(sys.executable) != str(VENV_PYTHON):
        sys.stdout.flush()
        os.execv(VENV_PYTHON, [str(VENV_PYTHON), str(Path(__file__).resolve()), *argv])
    make = "make" if ROOT == Path.cwd() else f"make -C {shown(ROOT)}"
    command = " ".join([shown(VENV_PYTHON), shown(Path(__file__).resolve()), *argv])
    print(f"verify needs the project's packages, which {sys.executable} lacks ({missing}): "
          f"run `{make} install-run`, then `{command}`", file=sys.stderr)
    return 1


def cmd_verify(args, argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    try:
        from jobs.media.credentials import verify
    except ImportError as exc:
        return with_project_packages(argv, exc)

    trust = args.trust or os.environ.get("IMAGEGEN_C2PA_TRUST_ANCHORS") or ""
    embedded_root = var_dir() / "c2pa" / "root.pem"
    if not trust and embedded_root.exists():
        trust = str(embedded_root)
    check = verify(Path(args.file).read_bytes(), trust_anchors=trust or None)
    report = {"file": args.file, "state": check.state, "verified": check.ok, "trusted": check.trusted,
              "actions": check.actions, "parameters": check.parameters,
              "signer": check.manifest.get("signature_info", {}), "failures": check.failures}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{args.file}: {check.state}" + (" (signature intact, signer not trusted)" if check.ok and not check.trusted else ""))
        signer = report["signer"]
        if signer:
            print(f"  signed by {signer.get('common_name')} ({signer.get('issuer')}), {signer.get('alg')}")
        for action in check.actions:
            print(f"  {action.get('action')}: {action.get('digitalSourceType', '')} by {action.get('softwareAgent', {}).get('name', '?')}")
        for key, value in (check.parameters or {}).items():
            print(f"  {key}: {value}")
        for failure in check.failures:
            print(f"  failed: {failure.get('code')}: {failure.get('explanation')}")
    return 0 if check.trusted else 2 if check.ok else 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="imagegen_cli.py", description="imagegen command-line client (native API)")
    parser.add_argument("--url", help=f"server URL (env IMAGEGEN_URL, else var/run-info.txt's, else {DEFAULT_URL})")
    parser.add_argument("--token", help="API token (env IMAGEGEN_TOKEN, else var/run-info.txt's for its URL)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request (watch: between events)")
    sub = parser.add_subparsers(dest="command", required=True)

    submit = sub.add_parser("submit", help="submit a job and print its id")
    submit.add_argument("prompt")
    submit.add_argument("--negative-prompt", dest="negative_prompt")
    submit.add_argument("--size", type=parse_size, help="WIDTHxHEIGHT from the size menu (default: the first)")
    submit.add_argument("--steps", type=int)
    submit.add_argument("--seed", type=int)
    submit.add_argument("--count", type=int, default=1)
    submit.add_argument("--guidance-scale", dest="guidance_scale", type=float)
    submit.set_defaults(func=cmd_submit)

    watch = sub.add_parser("watch", help="print the job's events until it ends (previews as a short note)")
    watch.add_argument("job_id")
    watch.set_defaults(func=cmd_watch)

    get = sub.add_parser("get", help="print the job's JSON")
    get.add_argument("job_id")
    get.set_defaults(func=cmd_get)

    download = sub.add_parser("download", help="save the job's images (PNG, JPEG or WebP, as the job made them)")
    download.add_argument("job_id")
    download.add_argument("-o", "--output", default=".", help="folder (default: the current one)")
    download.set_defaults(func=cmd_download)

    verify = sub.add_parser("verify", help="check a file's content credentials (C2PA); no server needed")
    verify.add_argument("file")
    verify.add_argument("--trust", help="a PEM file of trusted root certificates (env IMAGEGEN_C2PA_TRUST_ANCHORS)")
    verify.add_argument("--json", action="store_true", help="the report as JSON")
    verify.set_defaults(func=None)
    return parser


def run_info(path: Path) -> tuple[str, str] | None:
    """(URL, token) from the block `make run` writes once the service is ready (scripts/run.py)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    url = re.search(r"imagegen is ready at (\S+)", text)
    token = re.search(r"^\s*API token\s+(\S+)\s*$", text, re.MULTILINE)
    return (url[1].rstrip("/"), token[1]) if url and token else None


def connection(args) -> tuple[str, str | None, str]:
    """The server URL, the token and, when no token was found, the one line that says why."""
    path = var_dir() / "run-info.txt"
    info = run_info(path)
    url = (args.url or os.environ.get("IMAGEGEN_URL") or (info[0] if info else DEFAULT_URL)).rstrip("/")
    token = args.token or os.environ.get("IMAGEGEN_TOKEN")
    if token:
        return url, token, ""
    if info and info[0] == url:
        return url, info[1], ""
    if info:
        return url, None, (f"no API token for {url}: pass --token or set IMAGEGEN_TOKEN "
                           f"(the token in {shown(path)} is for {info[0]})")
    return url, None, (f"no API token: pass --token, set IMAGEGEN_TOKEN, or start the service with `make run` "
                       f"(it writes one to {shown(path)}; or `.venv/bin/python manage.py issue_token USER`)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.command == "verify":
        return cmd_verify(args, argv)
    url, token, missing = connection(args)
    if not token:
        print(missing, file=sys.stderr)
        return 1
    client = Client(url, token, timeout=args.timeout)
    try:
        return args.func(client, args)
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
