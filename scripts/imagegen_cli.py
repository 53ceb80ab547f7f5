#!/usr/bin/env python3
"""A small command-line client for the imagegen native API (standard library only).

    imagegen_cli.py submit "a red circle on a blue background" --size 64x64 --seed 7   # prints the job id
    imagegen_cli.py watch JOB_ID          # follows the job's server-sent events until it ends
    imagegen_cli.py download JOB_ID -o out/   # saves the job's images as PNG files
    imagegen_cli.py get JOB_ID            # the job's JSON

The server and the API token come from --url / --token, or IMAGEGEN_URL / IMAGEGEN_TOKEN
(default URL http://127.0.0.1:8000). Get a token with `python manage.py issue_token USER`.
Exit status: 0 on success; 1 on an HTTP or connection error; for `watch`, 2 when the job ends
in a status other than done.
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
