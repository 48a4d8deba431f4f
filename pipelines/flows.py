"""The flows under the module path that work-pool deployments registered before the
sub-packages name (`pipelines.flows.tag_history_flow`): such a deployment still loads.
New deployments name `pipelines.orchestration.flows`."""

from pipelines.orchestration.flows import alarm_history_flow, tag_history_flow

__all__ = ["alarm_history_flow", "tag_history_flow"]
