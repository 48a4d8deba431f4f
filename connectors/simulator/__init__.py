"""A faithful, deterministic node simulator: the whole REST interface over HTTP/HTTPS.

Choices where the interface spec is silent are documented in docs/node-behaviour.md.
"""

from connectors.simulator.config import SimConfig
from connectors.simulator.faults import KINDS as FAULT_KINDS
from connectors.simulator.faults import Faults
from connectors.simulator.node import SimulatedNode
from connectors.simulator.server import ServerHandle, run_server, serve_forever

__all__ = [
    "FAULT_KINDS",
    "Faults",
    "ServerHandle",
    "SimConfig",
    "SimulatedNode",
    "run_server",
    "serve_forever",
]
