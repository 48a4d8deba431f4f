"""Typed answers of every documented shape (pydantic), tolerant of fields the spec omits.

Every model keeps unknown fields (`extra="allow"`), takes the node's camelCase names and
offers snake_case attributes. The history fast path does not use these models: the
engine parses answer bytes straight into Arrow (`connectors/normalise/`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class NodeModel(BaseModel):
    # defer_build: a model's validator is built on its first use, not at import; a run
    # that fetches history never validates one, and building ~40 cost its start-up.
    model_config = ConfigDict(
        extra="allow", populate_by_name=True, alias_generator=to_camel, defer_build=True
    )


# -- alarms -----------------------------------------------------------------------------


class AckInfo(NodeModel):
    ts: int | None = None
    user: str | None = None
    msg: str | None = None


class AlarmRecord(NodeModel):
    path: str
    description: str | None = None
    priority: int | None = None
    remote: Any = None
    online: int | None = None
    status: int | None = None
    ts: int | None = None
    value: Any = None
    format: str | None = None
    type: str | None = None
    ack_info: AckInfo | dict[str, Any] | None = None


class AlarmHistoryFilter(NodeModel):
    path: str | None = None
    status: int | None = None
    min_priority: int | None = None
    max_priority: int | None = None


class AlarmHistoryOptions(NodeModel):
    recurrent: bool | None = None
    filter: AlarmHistoryFilter | None = None


class AlarmHistoryRequest(NodeModel):
    path: str | None = None
    start: int | str | None = None
    end: int | str | None = None
    options: AlarmHistoryOptions | None = None


class AlarmHistory(NodeModel):
    request: AlarmHistoryRequest | None = None
    data: list[Any] = Field(default_factory=list)


# -- backups ----------------------------------------------------------------------------


class Backup(NodeModel):
    description: str | None = None
    user: str | None = None
    node: str | None = None
    ts: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)


class BackupLoadResult(NodeModel):
    completed: bool
    completed_rollback: bool | None = None
    rollback_saved: str | None = None
    rollback_save_failed: bool | None = None
    rollback_has_warnings: bool | None = None
    warnings: list[Any] = Field(default_factory=list)
    updated_modules: list[Any] = Field(default_factory=list)


# -- certificates -----------------------------------------------------------------------


class Certificate(NodeModel):
    id: str
    sn: str | None = None
    c: str | None = None
    o: str | None = None
    dn: str | None = None
    from_: int | None = Field(default=None, validation_alias=AliasChoices("from", "from_"))
    to: int | None = None
    type: str | None = None
    status: str | None = None


# -- modules ----------------------------------------------------------------------------


class ModuleEntry(NodeModel):
    config: dict[str, Any] = Field(default_factory=dict)
    license: dict[str, Any] = Field(default_factory=dict)
    running: bool | None = None
    mode: str | None = None
    last_start: str | None = None
    last_stop: str | None = None
    pid: int | None = None
    api: dict[str, Any] = Field(default_factory=dict)


class ModuleDetails(NodeModel):
    ts: str | None = None
    running: bool | None = None
    uptime: str | None = None
    pid: int | None = None
    memory_usage: dict[str, str] = Field(default_factory=dict)
    modules: dict[str, ModuleEntry] = Field(default_factory=dict)


class ConfigListEntry(NodeModel):
    text: str | None = None
    icon: str | None = None


# -- links ------------------------------------------------------------------------------


class LinkView(NodeModel):
    name: str | None = None
    ro: bool | None = None
    ae: bool | None = None
    ack: bool | None = None


class LinkSide(NodeModel):
    subscription: str | None = None
    view: LinkView | None = None
    sf: dict[str, Any] = Field(default_factory=dict)
    tag_count: int | None = None
    gzip: bool | None = None
    endpoint: str | None = None


class Link(NodeModel):
    name: str | None = None
    type: str | None = None
    online: bool | None = None
    local: LinkSide | None = None
    remote: LinkSide | None = None


class NodeInfo(NodeModel):
    name: str | None = None


class Links(NodeModel):
    node_info: NodeInfo | None = None
    links: dict[str, Link] = Field(default_factory=dict)


# -- licenses, logs, redundancy, system ---------------------------------------------------


class NodeUid(NodeModel):
    host: str
    uid: str


class LicenseModule(NodeModel):
    type: str | None = None
    tag_access: str | None = None
    count: int | None = None
    used: int | None = None


class LicenseEntry(NodeModel):
    version: Any = None
    host: str | None = None
    uid: str | None = None
    expires: str | None = None
    type: str | None = None
    support_expires: int | str | None = None
    nonce: int | None = None
    id: str | None = None
    modules: list[LicenseModule] = Field(default_factory=list)
    error: str | None = None


class LicenseFile(NodeModel):
    path: str | None = None
    name: str
    error: str | None = None
    id: str | None = None
    host: str | None = None
    uid: str | None = None
    unlicensed: bool | None = None
    nonce: int | None = None
    licenses: list[LicenseEntry] = Field(default_factory=list)


# `log/?cmd=browse`: module name -> [(date YYYY-MM-DD, integer)]; the integer's meaning
# is not shown (the simulator uses a size in bytes).
LogBrowse = dict[str, list[tuple[str, int]]]


class RedundancyStatus(NodeModel):
    enabled: bool
    standby: bool
    mode: str | None = None


class N3Tags(NodeModel):
    total: int = 0
    local: int = 0
    remote: int = 0


class N3Status(NodeModel):
    pid: int | None = None
    up: int | None = None
    versions: list[str] = Field(default_factory=list)
    node: str | None = None
    tags: N3Tags | None = None
    errors: list[Any] = Field(default_factory=list)


class SysStatus(NodeModel):
    standby: bool | None = None
    hostname: str | None = None
    ts: int | None = None
    up: int | None = None
    cpu: list[Any] = Field(default_factory=list)
    usage: dict[str, list[int]] = Field(default_factory=dict)


class SystemStatus(NodeModel):
    n3: N3Status | None = None
    sys: SysStatus | None = None


# -- tags -------------------------------------------------------------------------------


class TagStatus(NodeModel):
    value: int | None = None
    ts: int | None = None


class TagData(NodeModel):
    value: Any = None
    quality: int | None = None
    ts: int | None = None


class TagReadEntry(NodeModel):
    status: TagStatus | None = None
    data: TagData | None = None


class TagRead(NodeModel):
    tags: dict[str, TagReadEntry] = Field(default_factory=dict)


class TagDetailsEntry(NodeModel):
    id: int | None = None
    full_path: str | None = None
    remote: Any = None
    status: TagStatus | None = None
    data: TagData | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class TagDetails(NodeModel):
    description: str | None = None
    templates: list[str] = Field(
        default_factory=list, validation_alias=AliasChoices("_templates", "templates")
    )
    tags: dict[str, TagDetailsEntry] = Field(default_factory=dict)


class HistoryRequestOptions(NodeModel):
    mode: str | None = None
    method: str | None = None
    interval: int | str | None = None
    deadband: Any = None
    invalid_as_null: bool | None = None
    limit: int | str | None = None
    recurrent: bool | None = None


class HistoryRequest(NodeModel):
    tag: str | None = None
    start: int | str | None = None
    end: int | str | None = None
    options: HistoryRequestOptions | None = None
    data: Any = None


class TagHistory(NodeModel):
    request: HistoryRequest | None = None
    data: list[list[Any]] = Field(default_factory=list)


# `tag?cmd=historyMany|historyFilter`: an object keyed by tag path.
HistoryMany = dict[str, TagHistory]


class TagBrowse(NodeModel):
    """`tag?cmd=browse` (non-flat): groups keyed by name; tag entries are not shown."""

    groups: dict[str, Any] = Field(default_factory=dict)
    tags: dict[str, Any] | list[Any] | None = None


class Subscription(NodeModel):
    id: int
    model: dict[str, Any] = Field(default_factory=dict)


class SubscriptionRecord(NodeModel):
    id: int
    data: Any = None
    discarded_events: int = 0
    events: int = 0


class TagEvent(NodeModel):
    type: Literal["tag"] = "tag"
    tag: str
    data: TagData | None = None
    status: TagStatus | None = None


class ModelEvent(NodeModel):
    type: Literal["model"] = "model"
    model: dict[str, Any] = Field(default_factory=dict)


class SubscriptionEvents(NodeModel):
    discarded_events: int = 0
    remaining_events: int = 0
    # `type` is a literal of each event model: an event of a kind this reading does not
    # know stays the dict the node sent, rather than passing for a `model` event.
    events: list[TagEvent | ModelEvent | dict[str, Any]] = Field(default_factory=list)
