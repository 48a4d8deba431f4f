"""What the orchestration names on a Prefect server: the two flows, the backfill
deployments, the per-node concurrency limits and the artifacts a run leaves.

The flows (`flows.py`), their deployments (`deployments.py`) and the fleet that submits
to them and reads them back (`fleet.py`) all spell these names; each reads them here, so
none of the three imports another for a name.
"""

from __future__ import annotations

from pipelines.core.kinds import KINDS, kind_of

# The Prefect flow that runs flows.yaml flows of each kind.
FLOW_NAMES = {name: kind.prefect_flow for name, kind in KINDS.items()}
BACKFILL_SUFFIX = "-backfill"
NODE_LIMIT_PREFIX = "historian-node-"
SHARD_ARTIFACT_PREFIX = "historian-shard-"


def prefect_flow_name(kind: str) -> str:
    """`tag-history` or `alarm-history`: the Prefect flow of a flows.yaml flow's kind."""
    return kind_of(kind).prefect_flow


def backfill_deployment(flow_name: str, kind: str) -> str:
    """`tag-history/<flow>-backfill`: the deployment a sharded backfill's runs are made of."""
    return f"{prefect_flow_name(kind)}/{flow_name}{BACKFILL_SUFFIX}"


def node_limit_name(node: str) -> str:
    """`historian-node-<node>`: the global concurrency limit of a node's requests."""
    return f"{NODE_LIMIT_PREFIX}{node}"


def artifact_key(flow_name: str) -> str:
    """A run's summary artifact; keys are lowercase letters, digits and dashes."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in flow_name.lower()).strip("-")
    return f"historian-{slug[:80]}"


def shard_artifact_key(flow_name: str) -> str:
    """The table artifact a shard's run leaves for `fleet.wait_for_shards`."""
    slug = artifact_key(flow_name).removeprefix("historian-")
    return f"{SHARD_ARTIFACT_PREFIX}{slug}"[:100]
