"""The live tail (issue 32): a flow's tag changes from the node's subscription to its
sinks within seconds, beside the scheduled history that stays the truth.

subscription   the tail's subscription: named, stale ones cancelled, drained (each answer
               read into history rows: connectors/normalise/events.py), losses said
windows        rows by window of event time: what each commit writes, what is too late
gaps           windows that may have lost events, re-read by history at once
unit           one tailed (flow, node): poll, commit (held `live`), gaps
tail           `tail_flow`, what `historian tail` and `serve` call
"""

from pipelines.live.tail import TailCommit, TailSummary, tail_flow

__all__ = ["TailCommit", "TailSummary", "tail_flow"]
