"""The administrative resources: backups, certificates, modules, licenses, logs, links,
redundancy and system (spec: Resources, Endpoints).

All state is in memory and survives `system?cmd=restartService`. Backups and log exports
are real ZIP archives, Base64-encoded as the spec shows; "JSON string" answers are a JSON
string whose content is the JSON document.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import threading
import time
import zipfile
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson

from connectors.simulator.protocol import (
    Answer,
    Handler,
    Params,
    RequestError,
    iso_ms,
    json_answer,
    named,
    parse_list,
    required_str,
)

if TYPE_CHECKING:
    from connectors.simulator.node import SimulatedNode

VERSION = "1.21.13"
CONFIG_NAMES = ("logger", "api", "users", "tags", "views", "links")
MODULES = (
    ("Historian", "Historian"),
    ("RestApiServer", "RestApiServer"),
    ("ModbusClient", "ModbusClient"),
    ("Logger", "Logger"),
)
CERT_TYPES = ("links_inbound", "links_outbound", "inbound", "outbound")
_DAY_MS = 86_400_000


def config_document(name: str, modified_ms: int = 0) -> str:
    """A module configuration document serialised as a string (spec: Module)."""
    document = {
        "version": {"main": 1, "editor": 1},
        "result": ["Object", {"level": ["String", "info"], "enabled": ["Boolean", True]}],
        "editor": {"extends": {"module": name}, "modified": modified_ms, "library": {}},
    }
    return orjson.dumps(document).decode()


class ProcessState:
    """The node process: pid, start time, and the 503 window of `restartService`."""

    def __init__(self, restart_s: float) -> None:
        self._restart_s = restart_s
        self._lock = threading.Lock()
        self.pid = os.getpid() % 30_000 + 1_000
        self._started = time.monotonic()
        self._restarting_until = 0.0

    def restarting(self) -> bool:
        return time.monotonic() < self._restarting_until

    def uptime_s(self) -> int:
        return max(0, int(time.monotonic() - self._started))

    def restart(self) -> None:
        """Down for `restart_s` seconds, then up again with a new pid and uptime 0."""
        with self._lock:
            now = time.monotonic()
            self._restarting_until = now + self._restart_s
            self._started = now + self._restart_s
            self.pid += 1


class Admin:
    """Backups, certificates, modules, licenses, logs, links, redundancy and system."""

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node
        self._lock = threading.RLock()
        now = node.now_ms()
        self.process = ProcessState(node.config.restart_s)
        self.uid = f"SIM-{node.config.seed:04d}-{hashlib.sha1(node.config.node_name.encode()).hexdigest()[:8].upper()}"
        self._backups: dict[str, dict[str, Any]] = {}
        self._node_configs = {name: config_document(name) for name in CONFIG_NAMES}
        self._modules: dict[str, dict[str, Any]] = {}
        for index, (name, kind) in enumerate(MODULES):
            self._modules[name] = {
                "type": kind,
                "running": True,
                "pid": 2_000 + 10 * index,
                "lastStart": iso_ms(now - 3_600_000),
                "lastStop": iso_ms(now - 7_200_000),
                "configs": {"logger": config_document("logger"), "config": config_document(kind)},
            }
        self._certificates: dict[str, dict[str, Any]] = {}
        for cid, status, ctype in (
            ("own/node", "own", "inbound"),
            ("trusted/scada", "trusted", "outbound"),
            ("pending/client-7", "pending", "inbound"),
            ("pending/link-peer", "pending", "links_inbound"),
        ):
            self._certificates[cid] = _certificate(cid, status, ctype, now)
        self._license_files: dict[str, str] = {}
        self._licenses: dict[str, dict[str, Any]] = {}
        self._install_license(_license_document(self.uid, now), "sim-base.lic")

    def handlers(self) -> dict[str, Handler]:
        return {
            "backup.get": self.backup_get,
            "backup.export": self.backup_export,
            "backup.create": self.backup_create,
            "backup.rename": self.backup_rename,
            "backup.delete": self.backup_delete,
            "backup.import": self.backup_import,
            "backup.load": self.backup_load,
            "certificate.get": self.certificate_get,
            "certificate.export": self.certificate_export,
            "certificate.set": self.certificate_set,
            "certificate.remove": self.certificate_remove,
            "module.details": self.module_details,
            "module.getInstalled": lambda _: json_answer(
                sorted({m["type"] for m in self._modules.values()})
            ),
            "module.getInstances": self.module_instances,
            "module.getConfigList": self.module_config_list,
            "module.getConfigPresent": self.module_config_present,
            "module.getConfigData": self.module_config_data,
            "module.start": lambda body: self.module_run(body, "start"),
            "module.stop": lambda body: self.module_run(body, "stop"),
            "module.restart": lambda body: self.module_run(body, "restart"),
            "module.setConfigData": self.module_set_config,
            "link.get": self.link_get,
            "license.getUid": lambda _: json_answer({"host": "sim-host", "uid": self.uid}),
            "license.get": lambda _: json_answer(list(self._licenses.values())),
            "license.read": self.license_read,
            "license.add": self.license_add,
            "license.remove": self.license_remove,
            "log.browse": self.log_browse,
            "log.export": self.log_export,
            "redundancy.status": lambda _: json_answer(
                {"enabled": False, "standby": False, "mode": "primary"}
            ),
            "system.status": self.system_status,
            "system.errorCount": lambda _: Answer(body=b"0"),
            "system.restartService": self.restart_service,
        }

    # -- backups -----------------------------------------------------------------------------

    def _snapshot(self) -> bytes:
        """A real ZIP holding `config.json`: written tag values and module configurations."""
        document = {
            "node": self._node.config.node_name,
            "seed": self._node.config.seed,
            "tags": self._node.config.tags,
            "written": self._node.tags.written_values(),
            "nodeConfigs": self._node_configs,
            "modules": {name: m["configs"] for name, m in self._modules.items()},
        }
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("config.json", orjson.dumps(document, option=orjson.OPT_INDENT_2))
        return buffer.getvalue()

    def _backup_record(self, description: str, content: bytes) -> dict[str, Any]:
        return {
            "description": description,
            "user": "api",
            "node": self._node.config.node_name,
            "ts": iso_ms(self._node.now_ms()),
            "versions": {"exe": self.version(), "bootstrap": self.version()},
            "content": content,
        }

    def backup_get(self, params: Params) -> Answer:
        with self._lock:
            return json_answer(
                {
                    name: {k: v for k, v in record.items() if k != "content"}
                    for name, record in self._backups.items()
                }
            )

    def backup_create(self, body: Params) -> Answer:
        name = required_str(body, "name")
        metadata = body.get("metadata")
        description = metadata.get("description") if isinstance(metadata, dict) else None
        if body.get("metadata.description") is not None:
            description = body.get("metadata.description")
        with self._lock:
            record = self._backup_record(str(description or ""), self._snapshot())
            self._backups[name] = record
        return Answer()

    def backup_rename(self, body: Params) -> Answer:
        new = required_str(body, "rename")
        with self._lock:
            name = named(body, self._backups, "backup")
            if new in self._backups and new != name:
                raise RequestError(400, f"backup {new!r} already exists")
            self._backups[new] = self._backups.pop(name)
        return Answer()

    def backup_delete(self, body: Params) -> Answer:
        with self._lock:
            del self._backups[named(body, self._backups, "backup")]
        return Answer()

    def backup_export(self, params: Params) -> Answer:
        with self._lock:
            content = self._backups[named(params, self._backups, "backup")]["content"]
        return Answer(body=base64.b64encode(content), content_type="text/plain")

    def backup_import(self, body: Params) -> Answer:
        name = required_str(body, "name")
        data = required_str(body, "data")
        try:
            content = base64.b64decode(data, validate=True)
            with zipfile.ZipFile(io.BytesIO(content)) as archive:
                orjson.loads(archive.read("config.json"))
        except (ValueError, KeyError, zipfile.BadZipFile, orjson.JSONDecodeError):
            raise RequestError(400, "data is not a Base64 backup archive") from None
        with self._lock:
            self._backups[name] = self._backup_record("imported", content)
        return Answer()

    def backup_load(self, body: Params) -> Answer:
        """Restores written tag values and configurations from the backup."""
        with self._lock:
            name = named(body, self._backups, "backup")
            with zipfile.ZipFile(io.BytesIO(self._backups[name]["content"])) as archive:
                document = orjson.loads(archive.read("config.json"))
            self._node.tags.restore_values(document.get("written") or {}, self._node.now_ms())
            self._node_configs.update(document.get("nodeConfigs") or {})
            for module, configs in (document.get("modules") or {}).items():
                if module in self._modules and isinstance(configs, dict):
                    self._modules[module]["configs"] = dict(configs)
        return json_answer(
            {
                "completed": True,
                "completedRollback": False,
                "rollbackSaved": f"rollback-{name}",
                "rollbackSaveFailed": False,
                "rollbackHasWarnings": False,
                "warnings": [],
                "updatedModules": sorted(self._modules),
            }
        )

    # -- certificates --------------------------------------------------------------------------

    @staticmethod
    def _options(source: Params, post: bool) -> dict[str, Any]:
        """Certificate options: nested `options` in a POST body, dot keys in a GET."""
        if post:
            options = source.get("options")
            if not isinstance(options, dict):
                raise RequestError(400, "options is required")
            return options
        prefix = "options."
        return {key[len(prefix) :]: v for key, v in source.items() if key.startswith(prefix)}

    def _certificate_id(self, options: dict[str, Any]) -> str:
        cid = options.get("id")
        if not isinstance(cid, str) or not cid:
            raise RequestError(400, "options.id is required")
        if cid not in self._certificates:
            raise RequestError(404, f"certificate {cid!r} not found")
        return cid

    def certificate_get(self, params: Params) -> Answer:
        ctype = self._options(params, post=False).get("type")
        if ctype and ctype not in CERT_TYPES:
            raise RequestError(400, f"options.type must be one of {', '.join(CERT_TYPES)}")
        with self._lock:
            certificates = [
                c for c in self._certificates.values() if not ctype or c["type"] == ctype
            ]
        return json_answer(certificates)

    def certificate_export(self, params: Params) -> Answer:
        with self._lock:
            cid = self._certificate_id(self._options(params, post=False))
            base = cid.split("/", 1)[1]
        der = hashlib.sha256(base.encode()).digest() * 8
        pem = (
            "-----BEGIN CERTIFICATE-----\n"
            + base64.encodebytes(der).decode()
            + "-----END CERTIFICATE-----\n"
        )
        return json_answer(base64.b64encode(pem.encode()).decode())

    def certificate_set(self, body: Params) -> Answer:
        """`trust`: pending/x -> trusted/x; `untrust`: trusted/x -> pending/x."""
        options = self._options(body, post=True)
        action = options.get("action")
        if action not in ("trust", "untrust"):
            raise RequestError(400, "options.action must be trust or untrust")
        with self._lock:
            cid = self._certificate_id(options)
            certificate = self._certificates[cid]
            if certificate["status"] == "own":
                raise RequestError(400, "the node's own certificate cannot be trusted or untrusted")
            status = "trusted" if action == "trust" else "pending"
            new_id = f"{status}/{cid.split('/', 1)[1]}"
            del self._certificates[cid]
            self._certificates[new_id] = {**certificate, "id": new_id, "status": status}
        return Answer()

    def certificate_remove(self, body: Params) -> Answer:
        with self._lock:
            del self._certificates[self._certificate_id(self._options(body, post=True))]
        return Answer()

    # -- modules -------------------------------------------------------------------------------

    def _module_name(self, source: Params) -> str:
        return named(source, self._modules, "module", key="moduleName")

    def module_details(self, params: Params) -> Answer:
        with self._lock:
            modules = {name: _module_entry(name, m) for name, m in self._modules.items()}
        return json_answer(
            {
                "ts": iso_ms(self._node.now_ms()),
                "running": True,
                "uptime": f"{self.process.uptime_s()}s",
                "pid": self.process.pid,
                "memoryUsage": {
                    "rss": "80Mb",
                    "heapTotal": "40Mb",
                    "heapUsed": "30Mb",
                    "external": "2Mb",
                    "arrayBuffers": "1Mb",
                },
                "modules": modules,
            }
        )

    def module_instances(self, params: Params) -> Answer:
        wanted = set(parse_list(params.get("filter")))
        with self._lock:
            names = [
                n
                for n, m in self._modules.items()
                if not wanted or n in wanted or m["type"] in wanted
            ]
        return json_answer(names)

    def module_config_list(self, params: Params) -> Answer:
        module_type = params.get("moduleType")
        names: tuple[str, ...] = ("logger", "config") if module_type else CONFIG_NAMES
        return json_answer(
            {name: {"text": name.capitalize(), "icon": f"icon-{name}"} for name in names}
        )

    def _configs(self, source: Params) -> dict[str, str]:
        """The configurations of `moduleName`, or of the node itself when it is absent."""
        if not source.get("moduleName"):
            return self._node_configs
        configs: dict[str, str] = self._modules[self._module_name(source)]["configs"]
        return configs

    def module_config_present(self, params: Params) -> Answer:
        with self._lock:
            configs = self._configs(params)
            known = list(dict.fromkeys([*CONFIG_NAMES, "config", *configs]))
            return json_answer({name: name in configs for name in known})

    def module_config_data(self, params: Params) -> Answer:
        config_name = required_str(params, "configName")
        with self._lock:
            configs = self._configs(params)
            if config_name not in configs:
                raise RequestError(404, f"configuration {config_name!r} not found")
            return json_answer(configs[config_name])

    def module_run(self, body: Params, action: str) -> Answer:
        """start / stop / restart: `running`, `pid`, `lastStart` and `lastStop` change."""
        with self._lock:
            module = self._modules[self._module_name(body)]
            now = iso_ms(self._node.now_ms())
            if action in ("stop", "restart") and module["running"]:
                module["running"] = False
                module["lastStop"] = now
            if action in ("start", "restart") and not module["running"]:
                module["running"] = True
                module["lastStart"] = now
                module["pid"] += 1
        return Answer()

    def module_set_config(self, body: Params) -> Answer:
        """Saves the document; `tags` raises a `model` event; `options.restart` restarts."""
        config_name = required_str(body, "configName")
        data = required_str(body, "data")
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError:
            raise RequestError(400, "data is not a JSON document") from None
        options = body.get("options") if isinstance(body.get("options"), dict) else {}
        assert isinstance(options, dict)
        with self._lock:
            name = self._module_name(body)
            self._modules[name]["configs"][config_name] = data
        if config_name == "tags":
            self._node.subscriptions.publish_model()
        if options.get("restart") or body.get("options.restart"):
            self.module_run({"moduleName": name}, "restart")
        return Answer()

    # -- links, licenses, logs ------------------------------------------------------------------

    def link_get(self, params: Params) -> Answer:
        tree = self._node.tree(params.get("options.remoteNode"))
        remote = [spec for spec in self._node.tree().specs if spec.remote_lag_ms]
        return json_answer(self._node.link.answer(tree.node_name, remote, self._node.now_ms()))

    def _install_license(self, data: str, name: str) -> None:
        document = orjson.loads(data)
        licenses = document.get("licenses") if isinstance(document, dict) else None
        if not isinstance(licenses, list) or not licenses or not isinstance(licenses[0], dict):
            raise RequestError(400, "license document has no licenses")
        first = licenses[0]
        entries = []
        for lic in licenses:
            if not isinstance(lic, dict):
                raise RequestError(400, "license entries must be objects")
            expires = _epoch_ms(lic.get("expires"))
            expired = isinstance(expires, int) and expires < self._node.now_ms()
            entries.append(
                {
                    **lic,
                    "uid": self.uid if lic.get("uid") == "*" else lic.get("uid"),
                    "supportExpires": _epoch_ms(lic.get("supportExpires")),
                    "error": "license expired" if expired else "",
                    "modules": [{**m, "used": 0} for m in lic.get("modules", [])],
                }
            )
        with self._lock:
            self._license_files[name] = data
            self._licenses[name] = {
                "path": f"/licenses/{name}",
                "name": name,
                "error": "",
                "id": first.get("id"),
                "host": "sim-host",
                "uid": self.uid,
                "unlicensed": False,
                "nonce": first.get("nonce", 0),
                "licenses": entries,
            }

    def license_read(self, params: Params) -> Answer:
        with self._lock:
            return json_answer(self._license_files[named(params, self._license_files, "license")])

    def license_add(self, body: Params) -> Answer:
        """`data` is a license document as a JSON string; stored as `<first id>.lic`."""
        data = required_str(body, "data")
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise RequestError(400, "data is not a license document") from None
        licenses = document.get("licenses") if isinstance(document, dict) else None
        first = licenses[0] if isinstance(licenses, list) and licenses else None
        if not isinstance(first, dict):
            raise RequestError(400, "license document has no licenses")
        self._install_license(data, f"{first.get('id') or 'license'}.lic")
        return Answer()

    def license_remove(self, body: Params) -> Answer:
        with self._lock:
            name = named(body, self._license_files, "license")
            del self._license_files[name]
            del self._licenses[name]
        return Answer()

    def _log_days(self) -> dict[str, list[str]]:
        """Three days of logs up to today (by the node's clock) per module."""
        today = datetime.fromtimestamp(self._node.now_ms() / 1000, tz=UTC).date()
        days = [(today - timedelta(days=back)).isoformat() for back in (2, 1, 0)]
        return {name: days for name in ("Bootstrap", *self._modules)}

    def _log_text(self, module: str, day: str) -> str:
        lines = [
            f"{day}T{hour:02d}:00:00.000Z [info] {module}: simulated log line {hour}"
            for hour in range(0, 24, 3)
        ]
        return "\n".join(lines) + "\n"

    def log_browse(self, params: Params) -> Answer:
        """`[date, size in bytes]` pairs (the meaning of the integer is not shown)."""
        return json_answer(
            {
                module: [[day, len(self._log_text(module, day).encode())] for day in days]
                for module, days in self._log_days().items()
            }
        )

    def log_export(self, params: Params) -> Answer:
        selection = parse_list(params.get("selection"))
        if not selection:
            raise RequestError(400, "selection is required")
        available = self._log_days()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for item in dict.fromkeys(selection):
                module, _, day = item.rpartition(".")
                if day not in available.get(module, ()):
                    raise RequestError(404, f"log {item!r} not found")
                archive.writestr(f"{module}/{day}.log", self._log_text(module, day))
        return Answer(body=base64.b64encode(buffer.getvalue()), content_type="text/plain")

    # -- system --------------------------------------------------------------------------------

    def version(self) -> str:
        """The node's version: its profile's (node-1.21.5, node-1.21.12), else VERSION."""
        for behaviour, version in (("version_1_21_5", "1.21.5"), ("version_1_21_12", "1.21.12")):
            if self._node.behaves(behaviour):
                return version
        return VERSION

    def versions(self) -> list[str]:
        """`n3.versions`: the bare version, or (`verbose_versions`) the node's own among the
        runtime's, spelled with product names, as the spec does not show the spelling."""
        version = self.version()
        if self._node.behaves("verbose_versions"):
            return [
                "Node.js v18.19.1",
                f"N3uron exe v{version} (build 2406)",
                f"bootstrap {version}-r2",
            ]
        return [version]

    def system_status(self, params: Params) -> Answer:
        specs = self._node.tree().specs
        remote = sum(1 for spec in specs if spec.remote_lag_ms)
        up = self.process.uptime_s()
        return json_answer(
            {
                "n3": {
                    "pid": self.process.pid,
                    "up": up,
                    "versions": self.versions(),
                    "node": self._node.config.node_name,
                    "tags": {"total": len(specs), "local": len(specs) - remote, "remote": remote},
                    "errors": [],
                },
                "sys": {
                    "standby": False,
                    "hostname": "sim-host",
                    "ts": self._node.now_ms(),
                    "up": up + 86_400,
                    "cpu": ["Simulated CPU", 2, 2400],
                    "usage": {"cpu": [5, 100], "ram": [512, 24576], "disk": [10, 100]},
                },
                # Not in the spec: the simulator's own request counters (the peak of
                # concurrent requests shows whether clients kept to a node's limit).
                "simulator": {"requests": self._node.request_stats()},
            }
        )

    def restart_service(self, body: Params) -> Answer:
        """The node answers 503 for `restart_s`, then returns with a new pid; state is kept,
        but not its subscriptions (`subscriptions_survive_restart`: those too)."""
        self.process.restart()
        self._node.subscriptions.restart()
        with self._lock:
            now = iso_ms(self._node.now_ms())
            for module in self._modules.values():
                if module["running"]:
                    module["pid"] += 1
                    module["lastStop"] = now
                    module["lastStart"] = now
        return Answer()


def _certificate(cid: str, status: str, ctype: str, now: int) -> dict[str, Any]:
    return {
        "id": cid,
        "sn": cid.split("/", 1)[1],
        "c": "ES",
        "o": "Simulated Plant",
        "dn": "localhost",
        "from": now - _DAY_MS,
        "to": now + 365 * _DAY_MS,
        "type": ctype,
        "status": status,
    }


def _module_entry(name: str, module: dict[str, Any]) -> dict[str, Any]:
    return {
        "config": {
            "type": module["type"],
            "required": False,
            "start": {"enabled": True, "delay": 0},
            "monitor": {"enabled": True, "delay": 0},
        },
        "license": {"acquired": True, "period": 0, "mode": "production", "tagAccess": "local"},
        "running": module["running"],
        "mode": None,
        "lastStart": module["lastStart"],
        "lastStop": module["lastStop"],
        "pid": module["pid"] if module["running"] else 0,
        "api": {
            "online": module["running"],
            "info": {
                "type": module["type"],
                "category": ["data"],
                "version": VERSION,
                "releaseType": "stable",
                "fileversion": f"{VERSION}.0",
                "requisites": {
                    "bootstrapVersion": {"min": "1.21.0"},
                    "exeVersion": {"min": "1.21.0"},
                },
                "name": name,
            },
            "stats": {"tx": {"ok": 0, "error": 0}, "rx": {"ok": 0, "error": 0}},
        },
    }


def _license_document(uid: str, now: int) -> str:
    """The license installed at start: one production license for this node's uid."""
    expires = iso_ms(now + 365 * _DAY_MS)
    entry = {
        "version": 1,
        "host": "sim-host",
        "uid": uid,
        "expires": expires,
        "type": "production",
        "supportExpires": expires,
        "nonce": 1,
        "id": "sim-base",
        "modules": [{"type": "Historian", "tagAccess": "local", "count": 100_000}],
    }
    document = {
        "version": 1,
        "created": iso_ms(now),
        "signature": hashlib.sha256(uid.encode()).hexdigest(),
        "licenses": [entry],
    }
    return orjson.dumps(document).decode()


def _epoch_ms(value: Any) -> Any:
    """`supportExpires` is epoch ms in the list (spec) even when the file holds ISO 8601."""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return round(moment.timestamp() * 1000)
    return value
