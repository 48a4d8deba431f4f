"""Flows' schedules as Prefect reads them, checked before anything is served.

`historian check` and `historian serve` build each scheduled flow's Prefect schedule here,
with Prefect's own parser, so that a schedule Prefect refuses (`cron: "61 * * * *"`) is one
line naming its key instead of a traceback once the server is up. Imports Prefect: only
the commands that need it call this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.config.models import Config, ConfigError, ScheduleConfig
from pipelines.planning import short_duration


@dataclass(frozen=True)
class CheckedSchedule:
    flow: str
    text: str  # `every 15m (UTC)`, `cron 5 * * * * (Europe/Paris)`


def prefect_schedule(schedule: ScheduleConfig) -> Any:
    """The Prefect schedule (`prefect.schedules.Cron` / `Interval`) of a flow's schedule."""
    from prefect.schedules import Cron, Interval

    if schedule.cron is not None:
        return Cron(schedule.cron, timezone=schedule.timezone)
    assert schedule.interval is not None
    return Interval(schedule.interval, timezone=schedule.timezone)


def describe(schedule: ScheduleConfig) -> str:
    if schedule.cron is not None:
        return f"cron {schedule.cron} ({schedule.timezone})"
    assert schedule.interval is not None
    return f"every {short_duration(schedule.interval)} ({schedule.timezone})"


def check_schedule(name: str, schedule: ScheduleConfig) -> CheckedSchedule:
    """The flow's schedule as Prefect will fire it; ConfigError naming the key otherwise."""
    from prefect.client.schemas.schedules import construct_schedule

    key = f"flows.{name}.schedule"
    try:
        if schedule.cron is not None:
            construct_schedule(cron=schedule.cron, timezone=schedule.timezone)
        else:
            assert schedule.interval is not None
            construct_schedule(interval=schedule.interval, timezone=schedule.timezone)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        field = "cron" if schedule.cron is not None else "interval"
        raise ConfigError(f"{key}.{field}: {_reason(exc)}") from None
    return CheckedSchedule(name, describe(schedule))


def check_schedules(
    config: Config, names: list[str] | None = None, *, source: str = "flows.yaml"
) -> list[CheckedSchedule]:
    """Every scheduled flow's schedule (or only `names`'); the first refused one raises
    `source: flows.<name>.schedule.<key>: why`."""
    checked = []
    for name, flow in config.flows.items():
        if flow.schedule is None or (names and name not in names):
            continue
        try:
            checked.append(check_schedule(name, flow.schedule))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return checked


def _reason(exc: Exception) -> str:
    """The first message of a pydantic error (`Invalid cron string: "61 * * * *"`)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        listed = errors()
        if listed:
            text = str(listed[0].get("msg", exc))
            return text.removeprefix("Value error, ")
    return str(exc).splitlines()[0]
