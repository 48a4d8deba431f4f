"""The node's administration operations: backups, certificates, modules, licenses, logs,
links, redundancy, the service's restart, alarm acknowledgement and tag writes.

The extraction reads history and never administers a node, so these live beside the
client, not in it: `NodeAdmin(client)` asks through the client's one request path, with its
retries, deadline and typed errors unchanged.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from connectors import models
from connectors.answers import (
    Requester,
    base64_zip_of,
    empty,
    json_of,
    json_string_of,
    model_map_of,
    model_of,
    models_of,
    number_of,
    string_list,
)
from connectors.errors import MalformedAnswer
from connectors.params import list_param


class NodeAdmin:
    """Administration of one node through a client's requests (`NodeClient`)."""

    def __init__(self, client: Requester) -> None:
        self._client = client

    def alarm_ack(self, paths: Sequence[str], msg: str | None = None) -> None:
        body: dict[str, Any] = {"paths": list(paths)}
        if msg is not None:
            body["msg"] = msg
        empty("alarm.ack", self._client.request("alarm.ack", "POST", "alarm", "ack", body=body))

    def backup_get(self) -> dict[str, models.Backup]:
        response = self._client.request("backup.get", "GET", "backup", "get")
        return model_map_of("backup.get", response, models.Backup)

    def backup_export(self, name: str) -> bytes:
        response = self._client.request("backup.export", "GET", "backup", "export", {"name": name})
        return base64_zip_of("backup.export", response)

    def backup_create(self, name: str, description: str | None = None) -> None:
        body: dict[str, Any] = {"name": name}
        if description is not None:
            body["metadata"] = {"description": description}
        empty(
            "backup.create",
            self._client.request("backup.create", "POST", "backup", "create", body=body),
        )

    def backup_rename(self, name: str, new_name: str) -> None:
        body = {"name": name, "rename": new_name}
        empty(
            "backup.rename",
            self._client.request("backup.rename", "POST", "backup", "rename", body=body),
        )

    def backup_delete(self, name: str) -> None:
        empty(
            "backup.delete",
            self._client.request("backup.delete", "POST", "backup", "delete", body={"name": name}),
        )

    def backup_import(self, name: str, data: bytes | str) -> None:
        text = base64.b64encode(data).decode() if isinstance(data, bytes) else data
        body = {"name": name, "data": text}
        empty(
            "backup.import",
            self._client.request("backup.import", "POST", "backup", "import", body=body),
        )

    def backup_load(self, name: str) -> models.BackupLoadResult:
        response = self._client.request(
            "backup.load", "POST", "backup", "load", body={"name": name}
        )
        return model_of("backup.load", response, models.BackupLoadResult)

    @staticmethod
    def _cert_options(
        module_name: str | None, cert_type: str | None, cert_id: str | None = None
    ) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if module_name is not None:
            options["options.moduleName"] = module_name
        if cert_type is not None:
            options["options.type"] = cert_type
        if cert_id is not None:
            options["options.id"] = cert_id
        return options

    def certificate_get(
        self, cert_type: str | None = None, module_name: str | None = None
    ) -> list[models.Certificate]:
        params = self._cert_options(module_name, cert_type)
        response = self._client.request("certificate.get", "GET", "certificate", "get", params)
        return models_of("certificate.get", response, models.Certificate)

    def certificate_export(
        self, cert_id: str, cert_type: str | None = None, module_name: str | None = None
    ) -> bytes:
        """The certificate content (the node answers a JSON string of Base64)."""
        params = self._cert_options(module_name, cert_type, cert_id)
        response = self._client.request(
            "certificate.export", "GET", "certificate", "export", params
        )
        text = json_of("certificate.export", response)
        if not isinstance(text, str):
            raise MalformedAnswer(
                "certificate.export", "answer is not a JSON string", where=cert_id
            )
        try:
            return base64.b64decode(text, validate=True)
        except (ValueError, TypeError):
            raise MalformedAnswer(
                "certificate.export", "answer is not Base64", where=cert_id
            ) from None

    def certificate_set(
        self,
        cert_id: str,
        action: str,
        cert_type: str | None = None,
        module_name: str | None = None,
    ) -> None:
        if action not in ("trust", "untrust"):
            raise ValueError(f"action {action!r} is not trust or untrust")
        options = {**_certificate(cert_id, cert_type, module_name), "action": action}
        response = self._client.request(
            "certificate.set", "POST", "certificate", "set", body={"options": options}
        )
        empty("certificate.set", response)

    def certificate_remove(
        self, cert_id: str, cert_type: str | None = None, module_name: str | None = None
    ) -> None:
        options = _certificate(cert_id, cert_type, module_name)
        response = self._client.request(
            "certificate.remove", "POST", "certificate", "remove", body={"options": options}
        )
        empty("certificate.remove", response)

    def module_details(self) -> models.ModuleDetails:
        response = self._client.request("module.details", "GET", "module", "details")
        return model_of("module.details", response, models.ModuleDetails)

    def module_get_installed(self) -> list[str]:
        data = json_of(
            "module.getInstalled",
            self._client.request("module.getInstalled", "GET", "module", "getInstalled"),
        )
        return string_list("module.getInstalled", data)

    def module_get_instances(self, names: Sequence[str] | None = None) -> list[str]:
        params = {"filter": list_param(names)} if names else None
        response = self._client.request(
            "module.getInstances", "GET", "module", "getInstances", params
        )
        return string_list("module.getInstances", json_of("module.getInstances", response))

    def module_get_config_list(
        self, module_type: str | None = None
    ) -> dict[str, models.ConfigListEntry]:
        params = {"moduleType": module_type} if module_type else None
        response = self._client.request(
            "module.getConfigList", "GET", "module", "getConfigList", params
        )
        return model_map_of("module.getConfigList", response, models.ConfigListEntry)

    def module_get_config_present(self, module_name: str | None = None) -> dict[str, bool]:
        params = {"moduleName": module_name} if module_name else None
        response = self._client.request(
            "module.getConfigPresent", "GET", "module", "getConfigPresent", params
        )
        data = json_of("module.getConfigPresent", response)
        if not isinstance(data, dict):
            raise MalformedAnswer(
                "module.getConfigPresent", "answer is not an object", where="module"
            )
        return {str(key): bool(value) for key, value in data.items()}

    def module_get_config_data(self, config_name: str, module_name: str | None = None) -> Any:
        params: dict[str, Any] = {"configName": config_name}
        if module_name:
            params["moduleName"] = module_name
        response = self._client.request(
            "module.getConfigData", "GET", "module", "getConfigData", params
        )
        return json_string_of("module.getConfigData", response)

    def _module_post(self, cmd: str, module_name: str) -> None:
        operation = f"module.{cmd}"
        empty(
            operation,
            self._client.request(
                operation, "POST", "module", cmd, body={"moduleName": module_name}
            ),
        )

    def module_start(self, module_name: str) -> None:
        self._module_post("start", module_name)

    def module_stop(self, module_name: str) -> None:
        self._module_post("stop", module_name)

    def module_restart(self, module_name: str) -> None:
        self._module_post("restart", module_name)

    def module_set_config_data(
        self,
        module_name: str,
        config_name: str,
        data: str | Mapping[str, Any],
        *,
        restart: bool | None = None,
        delete_data: Sequence[str] | None = None,
    ) -> None:
        text = data if isinstance(data, str) else orjson.dumps(data).decode()
        body: dict[str, Any] = {"moduleName": module_name, "configName": config_name, "data": text}
        options: dict[str, Any] = {}
        if restart is not None:
            options["restart"] = restart
        if delete_data:
            options["deleteData"] = list(delete_data)
        if options:
            body["options"] = options
        response = self._client.request(
            "module.setConfigData", "POST", "module", "setConfigData", body=body
        )
        empty("module.setConfigData", response)

    def link_get(self, remote_node: str | Sequence[str] | None = None) -> models.Links:
        params: dict[str, Any] = {}
        if remote_node is not None:
            params["options.remoteNode"] = (
                remote_node if isinstance(remote_node, str) else list_param(remote_node)
            )
        return model_of(
            "link.get", self._client.request("link.get", "GET", "link", "get", params), models.Links
        )

    def license_get_uid(self) -> models.NodeUid:
        response = self._client.request("license.getUid", "GET", "license", "getUid")
        return model_of("license.getUid", response, models.NodeUid)

    def license_get(self) -> list[models.LicenseFile]:
        response = self._client.request("license.get", "GET", "license", "get")
        return models_of("license.get", response, models.LicenseFile)

    def license_read(self, name: str) -> Any:
        response = self._client.request("license.read", "GET", "license", "read", {"name": name})
        return json_string_of("license.read", response)

    def license_add(self, data: str | Mapping[str, Any]) -> None:
        text = data if isinstance(data, str) else orjson.dumps(data).decode()
        empty(
            "license.add",
            self._client.request("license.add", "POST", "license", "add", body={"data": text}),
        )

    def license_remove(self, name: str) -> None:
        response = self._client.request(
            "license.remove", "POST", "license", "remove", body={"name": name}
        )
        empty("license.remove", response)

    def log_browse(self) -> models.LogBrowse:
        """Log files per module as (date, integer) pairs (`/log/?cmd=browse`)."""
        data = json_of("log.browse", self._client.request("log.browse", "GET", "log/", "browse"))
        if not isinstance(data, dict):
            raise MalformedAnswer("log.browse", "answer is not an object", where="log")
        result: models.LogBrowse = {}
        for module, pairs in data.items():
            try:
                result[str(module)] = [(str(day), int(size)) for day, size in pairs]
            except (TypeError, ValueError):
                raise MalformedAnswer(
                    "log.browse", "entry is not a list of [date, integer]", where=str(module)
                ) from None
        return result

    def log_export(self, selection: Sequence[str]) -> bytes:
        response = self._client.request(
            "log.export", "GET", "log/", "export", {"selection": list_param(selection)}
        )
        return base64_zip_of("log.export", response)

    def redundancy_status(self) -> models.RedundancyStatus:
        response = self._client.request("redundancy.status", "GET", "redundancy", "status")
        return model_of("redundancy.status", response, models.RedundancyStatus)

    def system_error_count(self) -> int:
        return number_of(
            "system.errorCount",
            self._client.request("system.errorCount", "GET", "system", "errorCount"),
        )

    def system_restart_service(self) -> None:
        response = self._client.request("system.restartService", "POST", "system", "restartService")
        empty("system.restartService", response)

    def tag_write(self, path: str, value: float | bool | str) -> None:
        empty(
            "tag.write",
            self._client.request(
                "tag.write", "POST", "tag", "write", body={"path": path, "value": value}
            ),
        )

    def tag_write_many(self, values: Mapping[str, float | bool | str]) -> None:
        """`paths` is a comma-separated string (spec); paths holding a comma cannot be written here."""
        for path in values:
            if "," in path:
                raise ValueError(f"tag path {path!r} holds a comma: write it with tag_write")
        body = {"paths": ",".join(values), "values": list(values.values())}
        empty(
            "tag.writeMany",
            self._client.request("tag.writeMany", "POST", "tag", "writeMany", body=body),
        )


def _certificate(cert_id: str, cert_type: str | None, module_name: str | None) -> dict[str, Any]:
    """The options naming one certificate (type and module only when given)."""
    options: dict[str, Any] = {"id": cert_id}
    if module_name is not None:
        options["moduleName"] = module_name
    if cert_type is not None:
        options["type"] = cert_type
    return options
