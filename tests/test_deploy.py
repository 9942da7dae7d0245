"""Deployment files agree with the code: compose, Kubernetes and the Dockerfiles.

These read the files (docs/deploy.md records the control-API image built and run with Podman):
the compose file against the compose specification's JSON schema and the interpolation forms
podman-compose 1.0 reads as Docker Compose does; the mailbox path, its memory-backed shared
directory and the group that lets the control API open it; ports and probes against what the
apps serve (the control API's route table, a real control API with no engine or a stale one,
vLLM's own source); environment variables against what the code reads; images that install this
repository, under names that say their registry.
"""

from __future__ import annotations

import importlib.util
import json
import posixpath
import re
import shlex
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml

from control_harness import Rig, wait_until
from hotwire.control_api.api.app import create_app
from hotwire.control_api.api.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
# https://github.com/compose-spec/compose-spec/blob/a08f8d51631b7127ddac3d2c65537db429d0f1d0/schema/compose-spec.json
# (Apache-2.0, tests/data/compose-spec.LICENSE), unmodified
COMPOSE_SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
VLLM_PORT_DEFAULT = 8000


def _control_routes() -> set[tuple[str, str]]:
    """``(METHOD, path)`` the control API serves, from its OpenAPI document."""
    app = create_app(Settings())  # building the app opens nothing; the lifespan does
    return {(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops}


CONTROL_ROUTES = _control_routes()


def _vllm_has_get(path: str) -> bool:
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vLLM is not installed")
    pattern = re.compile(r"\.get\(\s*['\"]" + re.escape(path) + r"['\"]")
    source = Path(spec.submodule_search_locations[0]) / "entrypoints"
    return any(pattern.search(f.read_text(errors="ignore")) for f in source.rglob("*.py"))


def _env_literals(package: str) -> set[str]:
    names: set[str] = set()
    for f in (ROOT / package).rglob("*.py"):
        names |= set(re.findall(r"['\"](HOTWIRE_[A-Z0-9_]+)['\"]", f.read_text()))
    return names


ENGINE_ENV = _env_literals("engine_plugin") | _env_literals("shared")
CONTROL_ENV = set(Settings.ENV.values())


def _flag(args: list[str], name: str, default: object = None) -> object:
    return args[args.index(name) + 1] if name in args else default


def _url_in(command: list[str] | str) -> tuple[int, str]:
    text = command if isinstance(command, str) else " ".join(command)
    url = urlparse(re.search(r"https?://[^'\"\s)]+", text).group(0))
    return url.port, url.path


def _hotwire_names(names) -> set[str]:
    return {name for name in names if name.startswith("HOTWIRE_")}


def _dockerfile_env(steps: list[tuple[str, str]]) -> dict[str, str]:
    pairs = [word.split("=", 1) for op, args in steps if op == "ENV" for word in shlex.split(args)]
    return {key: value for key, value in pairs}


def _fully_qualified(image: str) -> bool:
    """A reference that names its registry: Docker Hub is not everyone's default (Podman asks,
    or refuses, for a short name)."""
    first, _, rest = image.partition("/")
    return bool(rest) and ("." in first or ":" in first or first == "localhost")


def _dockerfile(path: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with line continuations joined."""
    text = re.sub(r"\\\n", " ", (ROOT / path).read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


# Compose -----------------------------------------------------------------------------------

SERVICES = COMPOSE["services"]
VLLM, CONTROL = SERVICES["vllm"], SERVICES["control-api"]


def _builds(service: dict, dockerfile: str) -> bool:
    return service.get("build", {}).get("dockerfile") == dockerfile


def _volume_at(service: dict, target: str) -> str:
    for spec in service["volumes"]:
        source, _, path = spec.partition(":")
        if path.split(":")[0] == target:
            return source
    raise AssertionError(f"nothing mounted at {target}")


def test_compose_shares_one_memory_backed_mailbox():
    path = VLLM["environment"]["HOTWIRE_MAILBOX"]
    assert CONTROL["environment"]["HOTWIRE_MAILBOX"] == path
    directory = posixpath.dirname(path)
    volume = _volume_at(VLLM, directory)
    assert _volume_at(CONTROL, directory) == volume, "both containers must mount the same volume"
    assert COMPOSE["volumes"][volume]["driver_opts"]["type"] == "tmpfs"


def test_compose_ports_match_what_the_apps_listen_on():
    vllm_port = int(_flag(VLLM["command"], "--port", VLLM_PORT_DEFAULT))
    control_port = int(_flag(CONTROL["command"], "--port",
                             CONTROL["environment"].get("HOTWIRE_PORT", Settings().port)))
    assert f"{vllm_port}:{vllm_port}" in VLLM["ports"] and vllm_port == 8000
    assert f"{control_port}:{control_port}" in CONTROL["ports"] and control_port == 8001
    assert _url_in(VLLM["healthcheck"]["test"])[0] == vllm_port
    assert _url_in(CONTROL["healthcheck"]["test"])[0] == control_port


def test_compose_health_checks_hit_real_endpoints():
    assert ("GET", _url_in(CONTROL["healthcheck"]["test"])[1]) in CONTROL_ROUTES
    assert _url_in(CONTROL["healthcheck"]["test"])[1] == "/readyz"
    assert _vllm_has_get(_url_in(VLLM["healthcheck"]["test"])[1])


def test_compose_keeps_the_catalog_in_a_named_volume():
    state_dir = CONTROL["environment"]["HOTWIRE_STATE_DIR"]
    assert _volume_at(CONTROL, state_dir) in COMPOSE["volumes"]


def test_compose_reserves_a_gpu_for_vllm():
    [device] = VLLM["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def _listens_on(args: list[str], env: dict, image_env: dict[str, str]) -> str:
    """The interface ``hotwire control-api`` binds: flag, then environment (the container's, then
    the image's), then the code's default."""
    return str(_flag(args, "--host", env.get("HOTWIRE_HOST", image_env.get("HOTWIRE_HOST",
                                                                          Settings().host))))


CONTROL_IMAGE_ENV = _dockerfile_env(_dockerfile("deploy/Dockerfile.control-api"))


def test_the_control_api_binds_localhost_unless_a_deployment_says_otherwise():
    assert Settings().host == "127.0.0.1"
    assert CONTROL_IMAGE_ENV["HOTWIRE_HOST"] == "0.0.0.0"  # `docker run -p` reaches it


def test_compose_control_api_listens_on_every_interface_it_publishes():
    assert "--host" in CONTROL["command"] or "HOTWIRE_HOST" in CONTROL["environment"], \
        "say the bind explicitly: the code's default is localhost"
    assert _listens_on(CONTROL["command"], CONTROL["environment"], CONTROL_IMAGE_ENV) == "0.0.0.0"
    assert _flag(VLLM["command"], "--host") == "0.0.0.0"


def test_compose_requires_the_write_token_and_passes_the_read_token_on():
    env = CONTROL["environment"]
    assert re.fullmatch(r"\$\{HOTWIRE_TOKEN:\?[^}]+\}", env["HOTWIRE_TOKEN"]), \
        "no token, no start: compose stops with the message"
    assert env["HOTWIRE_READ_TOKEN"] is None, "no value: taken from the environment if set there"


def test_compose_file_follows_the_compose_specification():
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = [f"{e.json_path}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(COMPOSE)]
    assert errors == []
    broken = {**COMPOSE, "services": {**SERVICES, "vllm": {**VLLM, "shm-size": "8gb"}}}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken)), "the schema checks services"


def _interpolations(text: str) -> list[str]:
    """Every ``${...}`` outside comments."""
    values = [line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#")]
    return re.findall(r"\$\{[^}]*\}", "\n".join(values))


# What Docker Compose and podman-compose 1.0 (Debian 12) both substitute: ${X:-} and ${X-} are
# left as they stand by the latter, so a container would get the literal text.
PORTABLE = re.compile(r"\$\{\w+(:\?[^}]+|:-[^}]+)?\}")


def test_compose_interpolates_only_what_podman_compose_reads_too():
    found = _interpolations(COMPOSE_TEXT)
    assert found
    assert [x for x in found if not PORTABLE.fullmatch(x)] == []
    assert [x for x in ("${X:-}", "${X-}", "${X-a}") if PORTABLE.fullmatch(x)] == []


def test_compose_requires_only_the_write_token():
    # Compose interpolates every service, whatever the profile: a required variable of the
    # replicas profile would stop a plain `docker compose up`.
    required = {re.match(r"\$\{(\w+)", x).group(1) for x in _interpolations(COMPOSE_TEXT) if ":?" in x}
    assert required == {"HOTWIRE_TOKEN"}


def test_compose_mailbox_volumes_are_tmpfs_with_options_podman_accepts():
    mailboxes = {_volume_at(s, "/dev/shm/hotwire") for s in SERVICES.values()
                 if "HOTWIRE_MAILBOX" in s.get("environment", {})}
    assert len(mailboxes) == 3
    for name in mailboxes:
        opts = COMPOSE["volumes"][name]["driver_opts"]
        assert opts["type"] == "tmpfs" and opts["device"] == "tmpfs"
        assert "size=" not in opts.get("o", ""), "Podman refuses size= for a local volume"


def test_compose_names_images_under_a_registry_prefix():
    built = {name: svc for name, svc in SERVICES.items() if "build" in svc}
    for name, svc in built.items():
        assert re.fullmatch(r"\$\{HOTWIRE_REGISTRY:-localhost\}/hotwire/[a-z-]+:[\w.-]+", svc["image"]), name
    for name, svc in SERVICES.items():
        assert _fully_qualified(svc["image"].replace("${HOTWIRE_REGISTRY:-localhost}", "localhost")), name


CONTROL_IMAGE_GID = re.search(r"groupadd .*--gid (\d+)", (ROOT / "deploy/Dockerfile.control-api").read_text())


def test_compose_engine_gives_the_mailbox_the_control_apis_group():
    """The engine creates the mailbox 0660; the control API's image runs as a user of its own."""
    gid = CONTROL_IMAGE_GID.group(1)
    dockerfile = (ROOT / "deploy/Dockerfile.control-api").read_text()
    assert re.search(rf"useradd .*--gid {gid} .*hotwire", dockerfile) and "USER hotwire" in dockerfile
    for svc in SERVICES.values():
        if _builds(svc, "deploy/Dockerfile.vllm"):
            assert svc["environment"]["HOTWIRE_MAILBOX_GROUP"] == gid


def test_compose_env_names_are_read_by_the_code():
    assert _hotwire_names(VLLM["environment"]) <= ENGINE_ENV
    assert _hotwire_names(CONTROL["environment"]) <= CONTROL_ENV


@pytest.mark.parametrize("service,dockerfile", [("vllm", "deploy/Dockerfile.vllm"),
                                                ("control-api", "deploy/Dockerfile.control-api")])
def test_compose_builds_from_the_repository_dockerfiles(service, dockerfile):
    build = SERVICES[service]["build"]
    assert (ROOT / build["context"]).resolve() == ROOT
    assert build["dockerfile"] == dockerfile and (ROOT / dockerfile).is_file()


# Compose, profile `replicas`: two pairs on one PostgreSQL catalog ---------------------------

PROFILE = "replicas"
REPLICA_SERVICES = {name: svc for name, svc in SERVICES.items() if PROFILE in svc.get("profiles", [])}
[(PG_NAME, POSTGRES)] = [(n, s) for n, s in REPLICA_SERVICES.items() if "postgres" in s["image"]]


REPLICA_CONTROLS = {name: svc for name, svc in REPLICA_SERVICES.items()
                    if _builds(svc, "deploy/Dockerfile.control-api")}
# control API -> its engine: the vLLM service it depends on
REPLICA_PAIRS = {control: engine for control, svc in REPLICA_CONTROLS.items()
                 for engine in svc["depends_on"] if _builds(SERVICES[engine], "deploy/Dockerfile.vllm")}


def _start_command(text: str) -> list[str]:
    """The services named by the `docker compose --profile replicas up` line in ``text``."""
    line = re.search(r"docker compose --profile replicas up ([^\n`]*)", text).group(1)
    return [word for word in line.split() if not word.startswith("-")]


def test_compose_default_stays_the_single_sqlite_pair():
    assert {n for n, s in SERVICES.items() if "profiles" not in s} == {"vllm", "control-api"}
    assert set(SERVICES) - set(REPLICA_SERVICES) == {"vllm", "control-api"}
    assert "HOTWIRE_CATALOG_DSN" not in CONTROL["environment"]


def test_compose_replicas_profile_is_postgres_and_two_pairs():
    assert len(REPLICA_PAIRS) == 2 and len(set(REPLICA_PAIRS.values())) == 2
    assert set(REPLICA_SERVICES) == {PG_NAME, *REPLICA_PAIRS, *REPLICA_PAIRS.values()}
    registry, _, rest = POSTGRES["image"].partition("/")
    assert "." in registry and re.fullmatch(r"library/postgres:\d+", rest), \
        "a fully qualified, major-pinned image: registries other than Docker Hub may be the default"
    assert POSTGRES["healthcheck"]["test"][0] == "CMD-SHELL"
    assert POSTGRES["healthcheck"]["test"][1].startswith("pg_isready ")


def test_compose_health_checks_are_shell_lines():
    # podman-compose 1.0 joins a CMD list into one broken shell word; CMD-SHELL means the same to both
    for name, svc in SERVICES.items():
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD-SHELL" and len(test) == 2, name
        assert shlex.split(test[1]), name


def test_compose_naming_the_control_apis_starts_the_whole_profile():
    def closure(names: list[str]) -> set[str]:
        seen: set[str] = set()
        while names:
            name = names.pop()
            if name not in seen:
                seen.add(name)
                names += list(SERVICES[name].get("depends_on", {}))
        return seen

    for text in ((ROOT / "docker-compose.yml").read_text(), (ROOT / "docs/replicas.md").read_text()):
        named = _start_command(text)
        assert set(named) == set(REPLICA_CONTROLS)
        assert closure(named) == set(REPLICA_SERVICES)
    for control in REPLICA_CONTROLS.values():
        assert control["depends_on"][PG_NAME]["condition"] == "service_healthy"


@pytest.mark.parametrize("control", sorted(REPLICA_PAIRS))
def test_compose_each_replica_pair_shares_its_own_memory_backed_mailbox(control):
    engine = SERVICES[REPLICA_PAIRS[control]]
    path = engine["environment"]["HOTWIRE_MAILBOX"]
    assert SERVICES[control]["environment"]["HOTWIRE_MAILBOX"] == path
    directory = posixpath.dirname(path)
    volume = _volume_at(engine, directory)
    assert _volume_at(SERVICES[control], directory) == volume
    assert COMPOSE["volumes"][volume] == COMPOSE["volumes"][_volume_at(VLLM, directory)]  # tmpfs
    others = {_volume_at(SERVICES[e], directory) for c, e in REPLICA_PAIRS.items() if c != control}
    assert volume not in others | {_volume_at(VLLM, directory)}, "one mailbox per engine"


def test_compose_replicas_share_one_dsn_with_the_password_from_the_environment():
    [dsn] = {svc["environment"]["HOTWIRE_CATALOG_DSN"] for svc in REPLICA_CONTROLS.values()}
    url = urlparse(dsn)
    pg = POSTGRES["environment"]
    assert url.scheme == "postgresql" and url.hostname == PG_NAME and url.port == 5432
    assert url.username == pg["POSTGRES_USER"] and url.path == f"/{pg['POSTGRES_DB']}"
    variable = re.fullmatch(r"\$\{(\w+)\}", url.password or "")
    assert variable, "the password is interpolated from the environment, never written here"
    assert pg["POSTGRES_PASSWORD"] == "${" + variable.group(1) + "}"


def test_compose_replica_names_are_distinct():
    names = [svc["environment"]["HOTWIRE_REPLICA"] for svc in REPLICA_CONTROLS.values()]
    assert all(names) and len(set(names)) == len(names) == 2


def test_compose_replicas_keep_no_sqlite_catalog():
    for control in REPLICA_CONTROLS.values():
        assert "HOTWIRE_STATE_DIR" not in control["environment"]
        assert "state:" not in " ".join(control["volumes"])


@pytest.mark.parametrize("name", sorted(set(REPLICA_PAIRS) | set(REPLICA_PAIRS.values())))
def test_compose_replica_services_are_the_default_ones_on_other_ports(name):
    service = SERVICES[name]
    default = CONTROL if name in REPLICA_CONTROLS else VLLM
    for key in ("build", "image", "command", "healthcheck", "restart"):
        assert service[key] == default[key], key
    if default is VLLM:  # the same, but presets come from the engine's own control API
        [control] = [c for c, engine in REPLICA_PAIRS.items() if engine == name]
        assert service["environment"] == {**VLLM["environment"], "HOTWIRE_CONTROL_URL": f"http://{control}:8001"}
    else:
        assert _hotwire_names(service["environment"]) <= CONTROL_ENV
        for token in ("HOTWIRE_TOKEN", "HOTWIRE_READ_TOKEN"):
            assert service["environment"][token] == CONTROL["environment"][token]
        assert _listens_on(service["command"], service["environment"], CONTROL_IMAGE_ENV) == "0.0.0.0"
    [published] = service["ports"]
    [default_published] = default["ports"]
    assert published.split(":")[1] == default_published.split(":")[1]


def test_compose_host_ports_and_gpus_are_distinct():
    host_ports = [p.split(":")[0] for svc in SERVICES.values() for p in svc.get("ports", [])]
    assert len(set(host_ports)) == len(host_ports), "the SQLite pair may run beside the replicas"
    gpus = []
    for engine in REPLICA_PAIRS.values():
        [device] = SERVICES[engine]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "count" not in device
        gpus += device["device_ids"]
    assert len(set(gpus)) == len(gpus) == 2


# Dockerfiles -------------------------------------------------------------------------------

def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _installs_repo(steps: list[tuple[str, str]], no_deps: bool,
                   extras: frozenset[str] = frozenset()) -> None:
    [copy] = [args.split() for op, args in steps if op == "COPY"]
    assert copy[0] == ".", "the whole repository is the package source"
    [install] = [shlex.split(args.split("&&")[0]) for op, args in steps
                 if op == "RUN" and "pip install" in args]
    [target] = [word for word in install if word.split("[")[0] == copy[1]]
    assert target == copy[1] + (f"[{','.join(sorted(extras))}]" if extras else ""), \
        "pip installs what was copied, with these extras"
    assert extras <= _pyproject()["project"]["optional-dependencies"].keys()
    assert ("--no-deps" in install) == no_deps


def test_vllm_image_adds_hotwire_to_the_pinned_vllm_image():
    steps = _dockerfile("deploy/Dockerfile.vllm")
    assert steps[0] == ("FROM", "docker.io/vllm/vllm-openai:v0.25.1")
    _installs_repo(steps, no_deps=True)
    env = _dockerfile_env(steps)
    assert _hotwire_names(env) <= ENGINE_ENV
    assert env["HOTWIRE_MAILBOX"] == VLLM["environment"]["HOTWIRE_MAILBOX"]
    assert ("ENTRYPOINT", '["vllm", "serve"]') in steps


def test_control_api_image_runs_the_console_script():
    steps = _dockerfile("deploy/Dockerfile.control-api")
    assert steps[0] == ("FROM", "docker.io/library/python:3.11-slim")
    _installs_repo(steps, no_deps=False, extras={"postgres"})  # one image for SQLite and replicas
    assert ("ENTRYPOINT", '["hotwire"]') in steps and ("CMD", '["control-api"]') in steps
    assert _pyproject()["project"]["scripts"]["hotwire"] == "hotwire.control_api.cli:main"
    env = _dockerfile_env(steps)
    assert _hotwire_names(env) <= CONTROL_ENV
    assert env["HOTWIRE_MAILBOX"] == CONTROL["environment"]["HOTWIRE_MAILBOX"]
    assert ("EXPOSE", env["HOTWIRE_PORT"]) in steps


@pytest.mark.parametrize("dockerfile", ["deploy/Dockerfile.vllm", "deploy/Dockerfile.control-api"])
def test_build_context_holds_the_package_and_not_the_venv(dockerfile):
    ignored = {line.strip() for line in (ROOT / f"{dockerfile}.dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", ".git"} <= ignored
    pyproject = _pyproject()
    needed = {"pyproject.toml", pyproject["project"]["readme"],
              *pyproject["tool"]["setuptools"]["package-dir"].values()}
    assert not {path.split("/")[0] for path in needed} & ignored


# Kubernetes --------------------------------------------------------------------------------

class _Manifest:
    """One Kubernetes file: its documents, the pod workload (Deployment or StatefulSet) and the
    pod spec's containers and volumes by name."""

    def __init__(self, path: str):
        self.path = path
        self.text = (ROOT / path).read_text()
        self.docs = list(yaml.safe_load_all(self.text))
        [self.workload] = [d for d in self.docs if d["kind"] in ("Deployment", "StatefulSet")]
        self.services = [d for d in self.docs if d["kind"] == "Service"]
        self.pod = self.workload["spec"]["template"]["spec"]
        self.containers = {c["name"]: c for c in self.pod["containers"]}
        self.volumes = {v["name"]: v for v in self.pod["volumes"]}

    def kinds(self, kind: str) -> list[dict]:
        return [d for d in self.docs if d["kind"] == kind]


SINGLE = _Manifest("deploy/k8s/hotwire.yaml")  # one replica, SQLite on a claim
REPLICAS = _Manifest("deploy/k8s/hotwire-replicas.yaml")  # N replicas, one PostgreSQL catalog
MANIFESTS = pytest.mark.parametrize("k8s", [SINGLE, REPLICAS], ids=lambda m: Path(m.path).stem)
[PVC] = SINGLE.kinds("PersistentVolumeClaim")


def _env(container: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container["env"]}


def _env_from(container: dict, name: str) -> dict:
    [entry] = [e for e in container["env"] if e["name"] == name]
    return entry["valueFrom"]


def _mount_at(container: dict, path: str) -> str:
    [name] = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == path]
    return name


def _port(container: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return number


@MANIFESTS
def test_k8s_shares_one_memory_backed_mailbox(k8s):
    vllm, control = k8s.containers["vllm"], k8s.containers["control-api"]
    path = _env(vllm)["HOTWIRE_MAILBOX"]
    assert _env(control)["HOTWIRE_MAILBOX"] == path
    directory = posixpath.dirname(path)
    volume = _mount_at(vllm, directory)
    assert _mount_at(control, directory) == volume
    assert k8s.volumes[volume]["emptyDir"]["medium"] == "Memory"


@MANIFESTS
def test_k8s_probes_hit_real_endpoints_on_the_listening_ports(k8s):
    vllm, control = k8s.containers["vllm"], k8s.containers["control-api"]
    assert int(_flag(vllm["args"], "--port", VLLM_PORT_DEFAULT)) == 8000
    control_port = int(_flag(control["args"], "--port", Settings().port))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = vllm[probe]["httpGet"]
        assert _port(vllm, get["port"]) == 8000 and _vllm_has_get(get["path"])
    get = control["livenessProbe"]["httpGet"]
    assert get["path"] == LIVENESS and ("GET", get["path"]) in CONTROL_ROUTES
    assert _port(control, get["port"]) == control_port


LIVENESS = "/healthz"


@MANIFESTS
def test_k8s_pod_readiness_is_the_engines_alone(k8s):
    """A pod is ready when all its containers are: a control-API readiness probe would take the
    OpenAI API out of its Service whenever the control plane is unwell."""
    assert "readinessProbe" not in k8s.containers["control-api"]
    assert "startupProbe" not in k8s.containers["control-api"]
    assert set(k8s.containers) == {"vllm", "control-api"}


def test_the_control_api_liveness_probe_holds_while_readyz_fails(tmp_path):
    """On a real control API: no engine, an engine with nothing armed, a stale heartbeat. Each
    makes /readyz fail; the liveness path stays 200, so the kubelet restarts nothing."""
    rig = Rig(tmp_path, heartbeat_timeout_s=1.0)
    try:
        http = rig.start_api()
        states = {"no engine": http.get("/readyz").status_code}
        engine = rig.start_engine(armed=())
        wait_until(lambda: "armed" in http.get("/readyz").text, what="the unarmed engine seen")
        states["nothing armed"] = http.get("/readyz").status_code
        assert http.get(LIVENESS).status_code == 200
        engine.stop()
        rig.engine = rig.start_engine()
        wait_until(lambda: http.get("/readyz").status_code == 200, what="ready")
        rig.engine.paused.set()
        wait_until(lambda: http.get("/readyz").status_code == 503, what="a stale heartbeat")
        states["stale heartbeat"] = 503
        assert states == dict.fromkeys(states, 503)
        assert http.get(LIVENESS).status_code == 200
    finally:
        rig.stop()


def _service_targets(k8s: _Manifest, service: dict) -> dict[str, set[int]]:
    """Container name -> the ports of it ``service`` routes to."""
    owner = {p["name"]: (name, p["containerPort"]) for name, c in k8s.containers.items() for p in c["ports"]}
    found: dict[str, set[int]] = {}
    for port in service["spec"]["ports"]:
        container, number = owner[port["targetPort"]]
        assert port["port"] == number
        found.setdefault(container, set()).add(number)
    return found


@MANIFESTS
def test_k8s_openai_and_control_apis_have_services_of_their_own(k8s):
    labels = k8s.workload["spec"]["template"]["metadata"]["labels"]
    by_container: dict[str, list[dict]] = {}
    for service in k8s.services:
        assert service["spec"]["selector"].items() <= labels.items()
        assert k8s.workload["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
        [(container, ports)] = _service_targets(k8s, service).items()  # one container each
        by_container.setdefault(container, []).append(service)
        assert ports == ({8000} if container == "vllm" else {8001})
    [openai], [control] = by_container["vllm"], by_container["control-api"]
    assert not openai["spec"].get("publishNotReadyAddresses"), "only ready engines take traffic"
    assert control["spec"]["publishNotReadyAddresses"] is True, "reachable while the engine is not"
    assert openai["metadata"]["name"] == k8s.workload["metadata"]["name"]  # the name clients use


@MANIFESTS
def test_k8s_images_say_their_registry_as_compose_names_them(k8s):
    for name, container in k8s.containers.items():
        assert _fully_qualified(container["image"])
        compose = SERVICES["vllm" if name == "vllm" else "control-api"]["image"]
        assert container["image"] == compose.replace("${HOTWIRE_REGISTRY:-localhost}", "localhost")


@MANIFESTS
def test_k8s_engine_gives_the_mailbox_the_control_apis_group(k8s):
    gid = CONTROL_IMAGE_GID.group(1)
    assert _env(k8s.containers["vllm"])["HOTWIRE_MAILBOX_GROUP"] == gid
    assert str(k8s.pod["securityContext"]["fsGroup"]) == gid


def test_k8s_keeps_the_catalog_on_the_claim():
    control = SINGLE.containers["control-api"]
    volume = _mount_at(control, _env(control)["HOTWIRE_STATE_DIR"])
    assert SINGLE.volumes[volume]["persistentVolumeClaim"]["claimName"] == PVC["metadata"]["name"]
    assert SINGLE.workload["spec"]["strategy"]["type"] == "Recreate"  # one pod holds the claim
    assert SINGLE.workload["spec"]["replicas"] == 1
    assert "HOTWIRE_CATALOG_DSN" not in _env(control)  # SQLite: one replica


@MANIFESTS
def test_k8s_gpu_and_env_names(k8s):
    assert k8s.containers["vllm"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert _hotwire_names(_env(k8s.containers["vllm"])) <= ENGINE_ENV
    control = k8s.containers["control-api"]
    assert _hotwire_names(_env(control)) <= CONTROL_ENV
    token = _env_from(control, "HOTWIRE_TOKEN")["secretKeyRef"]
    assert token["name"] == "hotwire-control" and token["key"] == "token"
    read = _env_from(control, "HOTWIRE_READ_TOKEN")["secretKeyRef"]
    assert read["name"] == token["name"]
    assert read["optional"] is True  # no read-token key: reads stay open


@MANIFESTS
def test_k8s_control_api_listens_where_the_service_and_probes_reach_it(k8s):
    control = k8s.containers["control-api"]
    assert "--host" in control["args"] or "HOTWIRE_HOST" in _env(control), \
        "say the bind explicitly: the code's default is localhost"
    assert _listens_on(control["args"], _env(control), CONTROL_IMAGE_ENV) == "0.0.0.0"
    assert _flag(k8s.containers["vllm"]["args"], "--host") == "0.0.0.0"


def test_k8s_replicas_run_the_single_replica_pod_with_a_shared_catalog():
    assert REPLICAS.workload["kind"] == "StatefulSet"
    assert REPLICAS.workload["spec"]["replicas"] == 2
    assert REPLICAS.workload["spec"]["podManagementPolicy"] == "Parallel"
    for name in ("vllm", "control-api"):
        assert REPLICAS.containers[name]["image"] == SINGLE.containers[name]["image"]
        assert REPLICAS.containers[name]["args"] == SINGLE.containers[name]["args"]
    assert REPLICAS.containers["vllm"] == SINGLE.containers["vllm"], "the engine is unchanged"


def test_k8s_replicas_read_the_dsn_from_a_secret():
    control = REPLICAS.containers["control-api"]
    [dsn] = [e for e in control["env"] if e["name"] == "HOTWIRE_CATALOG_DSN"]
    assert "value" not in dsn, "a DSN carries a password: never inline"
    ref = dsn["valueFrom"]["secretKeyRef"]
    assert ref["name"] != "hotwire-control" and ref["key"]
    assert not ref.get("optional", False), "a missing DSN must not fall back to an empty SQLite"
    assert f"secret generic {ref['name']} " in REPLICAS.text, "the comment says how to create it"
    assert f"--from-literal={ref['key']}=" in REPLICAS.text


def test_k8s_replicas_are_named_after_their_pods():
    control = REPLICAS.containers["control-api"]
    assert _env_from(control, "HOTWIRE_REPLICA") == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_k8s_replicas_store_nothing_in_the_pod():
    control = REPLICAS.containers["control-api"]
    assert "HOTWIRE_STATE_DIR" not in _env(control)
    assert not REPLICAS.kinds("PersistentVolumeClaim")
    assert "volumeClaimTemplates" not in REPLICAS.workload["spec"]
    assert all("emptyDir" in volume for volume in REPLICAS.volumes.values())


def test_k8s_replicas_manifest_runs_no_database():
    assert {d["kind"] for d in REPLICAS.docs} == {"StatefulSet", "Service"}
    assert set(REPLICAS.containers) == {"vllm", "control-api"}


def test_k8s_replicas_have_a_name_each_through_the_headless_service():
    [headless] = [s for s in REPLICAS.services if s["spec"].get("clusterIP") == "None"]
    assert REPLICAS.workload["spec"]["serviceName"] == headless["metadata"]["name"]


def test_k8s_both_files_can_share_a_namespace():
    names = [(d["kind"], d["metadata"]["name"]) for d in SINGLE.docs + REPLICAS.docs]
    assert len(names) == len(set(names))
    single, replicas = (m.workload["spec"]["template"]["metadata"]["labels"] for m in (SINGLE, REPLICAS))
    for service in SINGLE.services:
        assert not service["spec"]["selector"].items() <= replicas.items()
    for service in REPLICAS.services:
        assert not service["spec"]["selector"].items() <= single.items()
