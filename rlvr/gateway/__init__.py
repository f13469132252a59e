"""The rollout gateway: an OpenAI-compatible HTTP server in front of the current policy (rlvr.gateway.server)
that records, per episode (one API key), the exact token ids and sampler logprobs of every call
(rlvr.gateway.record), so agent programs written against the OpenAI client can be trained on exactly what they
sampled. Tool-call parsers: rlvr.gateway.tools. Importing this package costs no torch and no server: `Gateway`
(fastapi, uvicorn; `pip install 'rlvr[agents]'`) is imported on first use."""

from rlvr.gateway.record import CallRecord, EpisodeRecord, Segment, merge_calls
from rlvr.gateway.tools import TOOL_PARSERS, ParsedCompletion, ToolCall

__all__ = ["TOOL_PARSERS", "CallRecord", "EpisodeRecord", "Gateway", "ParsedCompletion", "Segment", "ToolCall",
           "merge_calls"]


def __getattr__(name: str):
    if name == "Gateway":
        from rlvr.gateway.server import Gateway

        return Gateway
    raise AttributeError(f"module 'rlvr.gateway' has no attribute {name!r}")
