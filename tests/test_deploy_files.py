"""The deploy files as one list: deploy/Procfile and deploy/kubernetes.yaml run the same process
types with the same commands (modulo the Procfile's shell wrapper: its `VAR=value` prefixes are the
manifest's `env`, its `$VAR` / `${VAR:-default}` are whatever the manifest writes there, a value
its `env` sets when it sets one) and consume the same queues, every queue of the routing table has
a consumer in both, and the image the manifest names is the one docs/operations.md builds from
the Containerfile. What can be checked of the Containerfile without a container runtime is checked
here too: its COPY sources exist and are not ignored, its default command is a Procfile line, it
installs the project's requirements, and those resolve in a clean virtualenv."""

from __future__ import annotations

import ast
import fnmatch
import ipaddress
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest
import yaml
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CONTAINERFILE = ROOT / "Containerfile"

PLACEHOLDER = re.compile(r"\$\{(?P<braced>[A-Za-z_]\w*)(?::-(?P<default>[^}]*))?\}|\$(?P<bare>[A-Za-z_]\w*)")
ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


@dataclass
class Process:
    """One process type as a deploy file runs it."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    image: str = ""
    gpu: bool = False


def procfile() -> dict[str, Process]:
    """deploy/Procfile's lines (`type: [VAR=value ...] command ...`), split as a shell would."""
    processes: dict[str, Process] = {}
    for line in (DEPLOY / "Procfile").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, command = line.partition(":")
        words = shlex.split(command)
        env = {}
        while words and ASSIGNMENT.match(words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        assert name.strip() not in processes, f"deploy/Procfile: {name} twice"
        processes[name.strip()] = Process(name.strip(), words, env)
    return processes


def manifest() -> list[Process]:
    """Every container of deploy/kubernetes.yaml's Deployments; its name is the process type."""
    containers = []
    for doc in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()):
        if not doc or doc.get("kind") != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e}
            gpu = "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
            containers.append(Process(c["name"], [str(w) for w in c["command"] + c.get("args", [])], env, c["image"], gpu))
    return containers


def unmatched(pattern: str, word: str, env: dict[str, str]) -> str | None:
    """Why the manifest's (or image's) `word` is not the Procfile's `pattern` (None: it is).
    A placeholder stands for any value, the one `env` gives it where `env` sets the variable;
    Kubernetes' own `$(VAR)` is the value of its `env`."""
    word = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), word)
    names, regex, last = [], "", 0
    for m in PLACEHOLDER.finditer(pattern):
        regex += re.escape(pattern[last:m.start()]) + "(.+?)"
        names.append(m.group("braced") or m.group("bare"))
        last = m.end()
    found = re.fullmatch(regex + re.escape(pattern[last:]), word)
    if not found:
        return f"{word!r} is not {pattern!r}"
    for name, value in zip(names, found.groups(), strict=True):
        if name in env and env[name] != value:
            return f"{word!r}: {name} is {env[name]!r} in its env, not {value!r}"
    return None


def command_differences(line: Process, other: Process) -> list[str]:
    if len(line.argv) != len(other.argv):
        return [f"{shlex.join(other.argv)!r} is not {shlex.join(line.argv)!r}"]
    problems = [p for a, b in zip(line.argv, other.argv, strict=True) if (p := unmatched(a, b, other.env))]
    for key, value in line.env.items():
        if key not in other.env:
            problems.append(f"sets no {key} (the Procfile's {key}={value})")
        elif PLACEHOLDER.search(value) is None and other.env[key] != value:
            problems.append(f"{key}={other.env[key]!r}, the Procfile's is {value!r}")
    return problems


def queues(argv: list[str]) -> list[str]:
    """The queues a worker command consumes (`-Q a,b` / `--queues=a,b`)."""
    consumed = []
    for i, word in enumerate(argv):
        if word in ("-Q", "--queues") and i + 1 < len(argv):
            consumed += argv[i + 1].split(",")
        elif word.startswith(("-Q", "--queues=")) and word not in ("-Q", "--queues"):
            consumed += word.split("=", 1)[-1].removeprefix("-Q").split(",")
    return consumed


def test_the_procfile_and_the_manifest_run_the_same_process_types():
    lines, containers = procfile(), manifest()
    assert {"web", "cpu", "classify", "io", "webhooks", "beat", "gpu"} <= set(lines)
    assert {c.name for c in containers} == set(lines), "process types of deploy/kubernetes.yaml vs deploy/Procfile"


def test_the_procfile_and_the_manifest_run_the_same_commands():
    """Each container's command is its Procfile line's, and sets the variables the line sets."""
    lines = procfile()
    problems = {c.name: p for c in manifest() if (p := command_differences(lines[c.name], c))}
    assert not problems, f"deploy/kubernetes.yaml differs from deploy/Procfile: {problems}"


def test_the_manifests_web_port_is_the_one_it_listens_on():
    """The port the manifest's web command binds (the Procfile's $PORT) is the container port
    and the probes' port, and the image's default command binds the port it exposes."""
    for doc in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()):
        if not doc or doc.get("kind") != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            if "--port" in c["command"]:
                port = int(c["command"][c["command"].index("--port") + 1])
                assert [p["containerPort"] for p in c["ports"]] == [port], c["name"]
                for probe in ("readinessProbe", "livenessProbe"):
                    assert c[probe]["httpGet"]["port"] == port, (c["name"], probe)
    found = dict(instructions())
    argv = json.loads(found["CMD"])
    assert found["EXPOSE"] == argv[argv.index("--port") + 1]


def test_the_procfile_and_the_manifest_consume_the_same_queues():
    lines = procfile()
    for c in manifest():
        patterns, consumed = queues(lines[c.name].argv), queues(c.argv)
        assert len(patterns) == len(consumed), f"{c.name}: {consumed} vs the Procfile's {patterns}"
        for pattern, queue in zip(patterns, consumed, strict=True):
            assert unmatched(pattern, queue, c.env) is None, f"{c.name}: {unmatched(pattern, queue, c.env)}"


def test_the_deploy_files_consume_every_routed_queue():
    """Every queue of the routing table (the stage table and the upkeep tasks) has a consumer in
    deploy/Procfile and in deploy/kubernetes.yaml; a lane's queue is any queue under the GPU prefix
    (in the Procfile, gpu.$IMAGEGEN_MODEL_NAME)."""
    from imagegen import stage_table

    routed = stage_table.routed_queues()
    assert {"cpu", "io", "classify", "webhooks", settings.QUEUE_GPU_PREFIX + "{lane}"} <= routed
    for name, processes in (("Procfile", list(procfile().values())), ("kubernetes.yaml", manifest())):
        consumed = {q for p in processes for q in queues(p.argv)}
        missing = {q for q in routed if "{lane}" not in q and q not in consumed}
        if not any(q.startswith(settings.QUEUE_GPU_PREFIX) for q in consumed):
            missing.add(settings.QUEUE_GPU_PREFIX + "{lane}")
        assert not missing, f"deploy/{name} consumes no {sorted(missing)}"


def tagged(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else name + ":latest"


def documented_images() -> dict[str, str]:
    """The tags the build commands of docs/operations.md ("The image", linked from the README)
    give the images (`... build -f Containerfile [--build-arg A=B ...] -t NAME .`), each with its
    build arguments."""
    built: dict[str, str] = {}
    for args, name in re.findall(r"(?:podman|docker) build -f Containerfile((?: --build-arg \S+)*) -t (\S+) \.",
                                 (ROOT / "docs" / "operations.md").read_text()):
        assert built.get(tagged(name), args) == args, f"docs/operations.md builds {name} two ways"
        built[tagged(name)] = args
    return built


def test_the_manifest_runs_the_images_the_docs_build():
    """Every container runs an image docs/operations.md builds from the Containerfile: the GPU workers
    the one with torch's CUDA build (--build-arg TORCH_INDEX=...), every other the default
    (CPU torch)."""
    built = documented_images()
    for c in manifest():
        assert tagged(c.image) in built, f"{c.name} runs {c.image}, which docs/operations.md does not build"
        cuda = "TORCH_INDEX=" in built[tagged(c.image)]
        assert cuda == c.gpu, f"{c.name} runs {c.image}: {'CUDA' if cuda else 'CPU'} torch on a {'GPU' if c.gpu else 'CPU'} pod"


# The Containerfile, read without a container runtime.

def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in CONTAINERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Containerfile ends inside a continued line"
    return out


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in instructions():
        if keyword == "ENV":
            for word in shlex.split(rest):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def workdir() -> PurePosixPath:
    dirs = [rest for keyword, rest in instructions() if keyword == "WORKDIR"]
    assert dirs, "the Containerfile sets no WORKDIR"
    return PurePosixPath(dirs[-1])


def copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY/ADD from the build context."""
    out = []
    for keyword, rest in instructions():
        if keyword in ("COPY", "ADD"):
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            assert not any(w.startswith("--from") for w in shlex.split(rest)), "no multi-stage copies expected"
            out.append((words[:-1], words[-1]))
    return out


def ignored(path: str) -> bool:
    patterns = [ln.strip() for ln in (ROOT / ".containerignore").read_text().splitlines()
                if ln.strip() and not ln.lstrip().startswith("#")]
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatch(p, pattern.removeprefix("**/")) or fnmatch.fnmatch(p, pattern)
               for pattern in patterns for p in prefixes + list(parts))


def test_the_containerfile_builds_from_python_slim_and_runs_as_a_user():
    found = instructions()
    assert found[0] == ("FROM", "python:3.11-slim")
    users = [i for i, (keyword, _) in enumerate(found) if keyword == "USER"]
    assert users, "the image runs as root"
    assert found[users[-1]][1].split(":")[0] not in ("root", "0")
    assert all(keyword != "RUN" for keyword, _ in found[users[-1]:]), "a RUN after USER: the user set-up would not hold"
    assert image_env().get("HF_HUB_OFFLINE") == "1", "the Hugging Face libraries may download at run time"


def test_every_path_the_containerfile_copies_exists_and_is_in_the_build_context():
    for sources, _ in copies():
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path"
            assert not ignored(source), f"COPY {source}: .containerignore keeps it out of the build context"


def copied_here() -> dict[PurePosixPath, Path]:
    """Where each copied path lands in the image (destinations under WORKDIR)."""
    landed = {}
    for sources, dest in copies():
        target = PurePosixPath(dest) if dest.startswith("/") else workdir() / dest
        for source in sources:
            landed[target if len(sources) == 1 and not dest.endswith("/") else target / Path(source).name] = ROOT / source
    return landed


def in_image(path: PurePosixPath) -> Path | None:
    """The project file that lies at `path` in the image, if one does."""
    for target, source in copied_here().items():
        if path == target or target in path.parents:
            return source / path.relative_to(target)
    return None


def test_the_image_holds_every_package_the_service_imports_and_the_shipped_models():
    """Every project package the copied code imports is copied too, and so are the files the
    settings read from the project (templates, static, the safety policy, the shipped models);
    every model path the manifest names is a model in the image."""
    app = workdir()
    tops = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"}
    copied_tops = {s.name for s in copied_here().values()}
    for source in copied_here().values():
        for py in ([source] if source.suffix == ".py" else source.rglob("*.py")):
            for node in ast.walk(ast.parse(py.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
                for name in names:
                    top = name.split(".")[0]
                    if top in tops:
                        assert top in copied_tops or top + ".py" in copied_tops, f"{py.relative_to(ROOT)} imports {top}, not in the image"
    for needed in ("templates", "static", "safety/policy.json", "models/shapes-v2/model_index.json", "models/shapes-v1/model_index.json"):
        assert in_image(app / needed) is not None, f"{needed} is not in the image"
    paths = [c.env["IMAGEGEN_MODEL_PATH"] for c in manifest() if "IMAGEGEN_MODEL_PATH" in c.env]
    assert paths
    for path in paths:
        source = in_image(PurePosixPath(path))
        assert source is not None and (source / "model_index.json").exists(), f"IMAGEGEN_MODEL_PATH={path}: no model there in the image"


def test_the_images_default_command_is_a_procfile_line_and_exists():
    """CMD (exec form) is one of the Procfile's process types, its program is a console script
    the requirements install, and the application it names exists in the project."""
    found = dict(instructions())
    assert "ENTRYPOINT" not in found, "an ENTRYPOINT would prefix the manifest's commands"
    argv = json.loads(found["CMD"])
    image = Process("image", argv, image_env())
    matching = [name for name, line in procfile().items() if not command_differences(line, image)]
    assert matching, f"CMD {argv} is no line of deploy/Procfile"
    assert (Path(sys.executable).parent / argv[0]).exists(), f"{argv[0]} is installed by no requirement"
    for word in argv:
        if re.fullmatch(r"[a-z_]+(\.[a-z_]+)+:[a-z_]+", word):
            module, _, attr = word.partition(":")
            source = ROOT / (module.replace(".", "/") + ".py")
            assert source.exists() and in_image(workdir() / source.relative_to(ROOT).as_posix()) is not None, word
            assert re.search(rf"^{attr}\b", source.read_text(), re.M), word


@pytest.mark.integration  # starts a process or opens a socket of its own
def trusted_proxies(argv: list[str], env: dict[str, str]) -> str | None:
    """What a web command gives uvicorn's --forwarded-allow-ips, its placeholder written out
    (the shell's default, Kubernetes' $(VAR) from `env`); None when it gives none."""
    if "--forwarded-allow-ips" not in argv:
        return None
    value = argv[argv.index("--forwarded-allow-ips") + 1]
    value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)
    return PLACEHOLDER.sub(lambda m: env.get(m.group("braced") or m.group("bare"), m.group("default") or ""), value)


def test_no_deploy_file_lets_a_client_choose_its_own_address():
    """Issue 44, item 3: `--forwarded-allow-ips "*"` let any client that reaches a web process
    directly write X-Forwarded-For and be whoever it said for the throttles, sign-in locks and the
    /metrics allow-list, and IMAGEGEN_NUM_PROXIES=1 had the app read that header itself. Every web
    command (the Procfile's, the manifest's, the image's) trusts named proxies only (addresses or
    CIDRs, from IMAGEGEN_TRUSTED_PROXIES where the command has variables) and the app takes the
    address uvicorn settled on (IMAGEGEN_NUM_PROXIES=0)."""
    for path in (DEPLOY / "Procfile", DEPLOY / "kubernetes.yaml", CONTAINERFILE):
        lines = "\n".join(ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#"))
        written = re.findall(r"forwarded-allow-ips[\"',\s]+([^\s,\]]+)", lines)
        assert written and not [w for w in written if "*" in w], f"{path.name}: --forwarded-allow-ips {written}"
    web_line = procfile()["web"]
    assert "${IMAGEGEN_TRUSTED_PROXIES:-127.0.0.1}" in web_line.argv, web_line.argv
    webs = [("Procfile", web_line), ("image", Process("image", json.loads(dict(instructions())["CMD"]), image_env()))]
    webs += [("kubernetes.yaml", c) for c in manifest() if c.name == "web"]
    assert len(webs) == 3, webs
    for where, web in webs:
        trusted = trusted_proxies(web.argv, web.env)
        assert trusted, f"{where}: the web command names no proxy it trusts ({web.argv})"
        for entry in trusted.split(","):
            ipaddress.ip_network(entry.strip(), strict=False)  # an address or a CIDR, nothing else
        # the image's ENV is its processes' environment; the Procfile's line sets it itself
        assert web.env.get("IMAGEGEN_NUM_PROXIES") == "0", f"{where}: the app would read X-Forwarded-For itself"


def test_the_manifests_database_url_comes_from_a_secret():
    """Issue 44, item 3: PostgreSQL asks for a password (scram-sha-256), so DATABASE_URL carries
    one: every container reads it by name from the imagegen-env Secret (a pod whose Secret lacks
    it does not start) and no deploy file writes one."""
    seen = 0
    for doc in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()):
        if not doc or doc.get("kind") != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            url = [e for e in c.get("env", []) if e["name"] == "DATABASE_URL"]
            assert len(url) == 1 and "value" not in url[0], f"{c['name']}: DATABASE_URL {url}"
            ref = url[0].get("valueFrom", {}).get("secretKeyRef", {})
            assert ref.get("name") == "imagegen-env" and ref.get("key") == "DATABASE_URL" and not ref.get("optional"), ref
            seen += 1
    assert seen >= 7, seen
    assert "DATABASE_URL" not in image_env() and "DATABASE_URL" not in (DEPLOY / "Procfile").read_text()


@pytest.mark.integration  # runs grep, as the build's shell would
def test_the_containerfile_installs_the_projects_requirements():
    """requirements.txt is copied from the project and installed with -r; the only other package
    named is torch, at requirements.txt's exact pin read from that file, from TORCH_INDEX (by
    default the CPU index)."""
    assert (["requirements.txt"], str(workdir() / "requirements.txt")) in copies()
    runs = " && ".join(rest for keyword, rest in instructions() if keyword == "RUN")
    installs = [c.strip() for c in re.split(r"&&|;", runs) if re.match(r"\s*(python -m )?pip install", c.strip())]
    assert any(re.search(r"\s-r requirements\.txt\b", c) for c in installs), installs
    pins = [ln for ln in (ROOT / "requirements.txt").read_text().splitlines() if re.match(r"torch==", ln)]
    assert len(pins) == 1 and re.fullmatch(r"torch==[\d.]+", pins[0]), pins
    for command in installs:
        words = shlex.split(command)
        packages = [w for i, w in enumerate(words[2:], 2) if not w.startswith("-") and words[i - 1] not in ("-r", "--index-url")]
        assert set(packages) <= {"$(grep -E '^torch==' requirements.txt)", "pip"}, command
        if "$(grep -E '^torch==' requirements.txt)" in command:
            grep = subprocess.run(["grep", "-E", "^torch==", "requirements.txt"], cwd=ROOT, capture_output=True, text=True)
            assert grep.stdout.splitlines() == pins
            assert '--index-url "$TORCH_INDEX"' in command
    assert ("ARG", "TORCH_INDEX=https://download.pytorch.org/whl/cpu") in instructions(), "the default image's torch is not the CPU build"


@pytest.mark.integration  # starts a process or opens a socket of its own
@pytest.mark.once
def test_the_requirements_resolve_in_a_clean_virtualenv(tmp_path):
    """`pip install --dry-run -r requirements.txt` in a fresh virtualenv, through the configured
    package indexes (the local ones and the registry) and the local wheel cache: everything
    resolves, and torch is the pinned CPU build with no CUDA packages pulled in. About 30 s here
    (measured: 28 s on this 2-core machine), so it runs with the suite."""
    venv = tmp_path / "venv"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
    report = tmp_path / "report.json"
    done = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                           "--report", str(report), "-r", str(ROOT / "requirements.txt")],
                          capture_output=True, text=True, timeout=540)  # a guard against a hang: under load it took over 240 s
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    pin = next(ln for ln in (ROOT / "requirements.txt").read_text().splitlines() if ln.startswith("torch=="))
    assert resolved["torch"].split("+")[0] == pin.split("==")[1]
    assert not [name for name in resolved if name.startswith("nvidia")], "the requirements pull a CUDA build of torch"
    assert {"django", "celery", "uvicorn", "diffusers"} <= set(resolved)


def test_the_committed_deploy_files_are_the_ones_the_stage_table_generates():
    """`manage.py deploy_files --check` (CI runs it too): the Procfile and the manifest's worker
    commands are what the stage table's process rows generate."""
    from django.core.management import call_command

    call_command("deploy_files", "--check")


@pytest.mark.django_db
def test_a_stage_declared_here_is_routed_reaches_the_deploy_files_and_is_recovered_by_the_reaper(monkeypatch, settings):
    """Issue 43, item 6: a stage added as one row (here, in the test) is routed to its queue, its
    task is named and configured from the row, the generated worker lines consume its queue (the
    committed files then differ: --check fails) and `make run`'s process list, and the reaper recovers it like the shipped
    batch stages: a batch whose message was lost is sent again (no attempt), one whose worker was
    killed mid-run (its lease run out) is run again (an attempt), each to the row's queue. No
    other file is edited."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from imagegen import stage_table
    from jobs.management.commands import deploy_files

    settings.QUEUE_WATERMARK = "watermark"
    row = stage_table.Stage("watermark", "tests.stages.watermark", "QUEUE_WATERMARK", leased=True,
                            retry_setting="IMAGEGEN_PUBLISH_RETRY_SECONDS", describes="watermarking the images",
                            reject_on_worker_lost=True, process="io", lease_setting="IMAGEGEN_LEASE_SECONDS",
                            resend_setting="IMAGEGEN_STAGE_RESEND_SECONDS")
    monkeypatch.setitem(stage_table.STAGES, "watermark", row)
    assert stage_table.route("tests.stages.watermark", ["shapes", "b1"], {}, {}) == {"queue": "watermark"}
    assert "watermark" in stage_table.routed_queues()

    @stage_table.stage_task("watermark")
    def watermark(lane: str, batch_id: str) -> str:
        return batch_id

    assert (watermark.name, watermark.acks_late, watermark.reject_on_worker_lost) == ("tests.stages.watermark", True, True)
    assert watermark.autoretry_for == (stage_table.StorageAway,)
    io_line = next(ln for ln in deploy_files.procfile().splitlines() if ln.startswith("io: "))
    assert "-Q io,watermark " in io_line
    with pytest.raises(CommandError):
        call_command("deploy_files", "--check")
    sys.path.insert(0, str(ROOT))
    from scripts import run

    make_run = dict(run.process_commands({}, "8000", Path("/tmp/x")))["worker-io"]  # `make run`'s io worker
    assert make_run[make_run.index("-Q") + 1].split(",") == ["io", "watermark"]

    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import Batch
    from jobs.pipeline import stages, tasks

    long_ago = timezone.now() - timedelta(days=1)
    shape = {"model_version": "tiny-random", "width": 64, "height": 64, "steps": 2, "guidance_scale": 5.0,
             "size": 1, "cap": 1, "lane": "shapes", "stage": "watermark"}
    # The batch's stage choices are the table's (no BatchStage value, no migration): the admin names it.
    assert "watermark" in dict(Batch._meta.get_field("stage").flatchoices)
    lost_message = Batch.objects.create(**shape, stage_sent_at=long_ago)
    killed_worker = Batch.objects.create(**shape, stage_sent_at=long_ago, stage_started_at=long_ago,
                                         stage_run="the-killed-run", lease_expires_at=long_ago)
    sent: list[tuple] = []
    monkeypatch.setattr(stages, "send", lambda stage, *args, **kw: sent.append((stage, *args)))
    tasks.reap()
    assert sorted(sent) == sorted([("watermark", "shapes", str(lost_message.id)),
                                   ("watermark", "shapes", str(killed_worker.id))])
    assert all(stage_table.route(stage_table.STAGES[s[0]].task, list(s[1:]), {}, {}) == {"queue": "watermark"}
               for s in sent)
    lost_message.refresh_from_db()
    killed_worker.refresh_from_db()
    assert lost_message.stage_attempts == 0 and lost_message.stage_sent_at > long_ago  # re-sent, not an attempt
    assert killed_worker.stage_attempts == 1 and killed_worker.stage_run == ""  # re-run: the lost run counts


def test_the_manifest_gives_each_process_type_what_it_needs_at_start_and_the_key_only_to_those_that_sign():
    """Issue 44, item 2: every process used to refuse to start without the content credentials'
    key, and the manifest mounted none, so every pod would crash-loop. What each process type
    needs is derived here from the code: the web (signing_credentials.SIGNING_PROCESSES) and the
    workers whose stage rows load "signing_key" sign images; the manifest must give those the key
    and chain (env naming files under a read-only mount of a Secret volume) and no other pod."""
    from imagegen import signing_credentials, stage_table

    seen = set()
    for doc in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()):
        if not doc or doc.get("kind") != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            name = c["name"]
            seen.add(name)
            env = {e["name"]: str(e.get("value", "")) for e in c.get("env", [])}
            argv = [re.sub(r"\$\((\w+)\)", lambda m, env=env: env.get(m.group(1), m.group(0)), str(w)) for w in c["command"]]
            signs = name in signing_credentials.SIGNING_PROCESSES or "signing_key" in stage_table.loads_for(queues(argv))
            assert {"secretRef": {"name": "imagegen-env"}} in c.get("envFrom", []), f"{name}: no imagegen-env Secret"
            mounts = c.get("volumeMounts", [])
            secret_mounts = [m for m in mounts if "secret" in volumes.get(m["name"], {})]
            if not signs:
                assert "IMAGEGEN_C2PA_KEY" not in env and not secret_mounts, f"{name} does not sign: it gets no key"
                continue
            for var in ("IMAGEGEN_C2PA_KEY", "IMAGEGEN_C2PA_CERT"):
                path = PurePosixPath(env.get(var, ""))
                assert path.is_absolute(), f"{name} signs images: {var} must name a file"
                holder = [m for m in secret_mounts if PurePosixPath(m["mountPath"]) in path.parents]
                assert holder and holder[0].get("readOnly"), f"{name}: {var}={path} is under no read-only Secret mount"
                secret = volumes[holder[0]["name"]]["secret"]
                assert secret.get("secretName"), f"{name}: the mount of {path} names no Secret"
    assert {"web", "gpu"} <= seen and len(seen) >= 6, seen


@pytest.mark.integration  # starts processes of its own
def test_in_production_only_the_processes_that_sign_need_the_key(tmp_path):
    """Without IMAGEGEN_C2PA_KEY/CERT a worker that signs nothing starts (settings load), while the
    web's ASGI app refuses, naming the setting; a GPU worker refuses in its ready hook (the stage
    row's "signing_key" load: gpu_tasks/worker.py)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGEGEN_", "DJANGO_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "imagegen.settings", "IMAGEGEN_VAR_DIR": str(tmp_path),
                "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "IMAGEGEN_EMBEDDED": "false",
                "DJANGO_SECRET_KEY": "x" * 50, "IMAGEGEN_EXTRA_MODELS": "none"})

    def run(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    worker = run("import django; django.setup(); from imagegen.celery import app; print('started')")
    assert worker.returncode == 0 and "started" in worker.stdout, worker.stderr[-2000:]
    web = run("import imagegen.asgi")
    assert web.returncode != 0 and "IMAGEGEN_C2PA_KEY must name a PEM file" in web.stderr, web.stderr[-2000:]
    gpu = run("import django; django.setup(); from gpu_tasks import worker; worker._check_signing_key()")
    assert gpu.returncode == 3, (gpu.returncode, gpu.stderr[-2000:])
