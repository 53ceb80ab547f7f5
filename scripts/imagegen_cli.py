#!/usr/bin/env python3
"""A small command-line client for the imagegen native API (standard library only).

    imagegen_cli.py submit "a red circle on a blue background" --size 64x64 --seed 7   # prints the job id
    imagegen_cli.py watch JOB_ID          # follows the job's server-sent events until it ends
    imagegen_cli.py download JOB_ID -o out/   # saves the job's images as PNG files
    imagegen_cli.py get JOB_ID            # the job's JSON
    imagegen_cli.py verify FILE [--trust ROOTS.pem] [--json]   # the file's content credentials (C2PA)

The server and the API token come from --url / --token, or IMAGEGEN_URL / IMAGEGEN_TOKEN
(default URL http://127.0.0.1:8000). Get a token with `python manage.py issue_token USER`.
Exit status: 0 on success; 1 on an HTTP or connection error; for `watch`, 2 when the job ends
in a status other than done; for `verify`, 2 when the signature is intact but its signer is not
among the trusted roots, 3 when the file has no manifest or it does not verify.

`verify` needs no server and no token, but c2pa-python (the repository's requirements): it reads
the manifest with c2pa's reader and checks its signature, its binding to the file's bytes and its
certificate chain, trusting --trust, IMAGEGEN_C2PA_TRUST_ANCHORS or this checkout's embedded root
(var/c2pa/root.pem).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"


class ApiError(Exception):
    pass


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
            raise ApiError(describe_http_error(exc)) from None
        except urllib.error.URLError as exc:
            raise ApiError(f"cannot reach {self.base_url}: {exc.reason}") from None

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


def describe_http_error(exc: urllib.error.HTTPError) -> str:
    body = exc.read()
    try:
        payload = json.loads(body)
    except ValueError:
        payload = body.decode("utf-8", "replace")[:300]
    message = f"HTTP {exc.code}"
    if isinstance(payload, dict) and set(payload) - {"detail"}:
        message += f": {json.dumps(payload)}"
    elif isinstance(payload, dict):
        message += f": {payload['detail']}"
    elif payload:
        message += f": {payload}"
    retry_after = exc.headers.get("Retry-After")
    if retry_after:
        message += f" (retry after {retry_after} s)"
    return message


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
    try:
        width, height = text.lower().split("x")
        return int(width), int(height)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT") from None


def cmd_submit(client: Client, args) -> int:
    body: dict = {"prompt": args.prompt, "count": args.count}
    if args.size:
        body["width"], body["height"] = args.size
    for name in ("negative_prompt", "steps", "seed", "guidance_scale"):
        value = getattr(args, name)
        if value is not None:
            body[name] = value
    job = client.submit(body)
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


def cmd_verify(args) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from jobs.media.credentials import verify

    trust = args.trust or os.environ.get("IMAGEGEN_C2PA_TRUST_ANCHORS") or ""
    embedded_root = Path(__file__).resolve().parent.parent / "var" / "c2pa" / "root.pem"
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
    parser.add_argument("--url", default=os.environ.get("IMAGEGEN_URL") or DEFAULT_URL, help="server URL (env IMAGEGEN_URL)")
    parser.add_argument("--token", default=os.environ.get("IMAGEGEN_TOKEN"), help="API token (env IMAGEGEN_TOKEN)")
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

    download = sub.add_parser("download", help="save the job's images as PNG files")
    download.add_argument("job_id")
    download.add_argument("-o", "--output", default=".", help="folder (default: the current one)")
    download.set_defaults(func=cmd_download)

    verify = sub.add_parser("verify", help="check a file's content credentials (C2PA); no server needed")
    verify.add_argument("file")
    verify.add_argument("--trust", help="a PEM file of trusted root certificates (env IMAGEGEN_C2PA_TRUST_ANCHORS)")
    verify.add_argument("--json", action="store_true", help="the report as JSON")
    verify.set_defaults(func=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "verify":
        return cmd_verify(args)
    if not args.token:
        print("no API token: pass --token or set IMAGEGEN_TOKEN (python manage.py issue_token USER)", file=sys.stderr)
        return 1
    client = Client(args.url, args.token, timeout=args.timeout)
    try:
        return args.func(client, args)
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
