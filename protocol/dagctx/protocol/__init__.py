"""dagctx's wire contract: typed messages, the method table, errors and codec.

API Boundary: everything here is shared by the daemon and every client. It imports
nothing else of ours.
"""

from .errors import DagctxError, ErrorData, ResponseError
from .methods import METHODS, PROTOCOL_VERSION, MethodSpec
from .nodes import ROOT_SENTINEL, SUMMARY_NAME, SYSTEM_PROMPT_NAME, TERMINAL_STATUSES, Call, NodeInput

__all__ = [
    "Call",
    "NodeInput",
    "DagctxError",
    "ErrorData",
    "ResponseError",
    "METHODS",
    "MethodSpec",
    "PROTOCOL_VERSION",
    "ROOT_SENTINEL",
    "SUMMARY_NAME",
    "SYSTEM_PROMPT_NAME",
    "TERMINAL_STATUSES",
]
