"""rollserve's contract: what goes over the wire, as typed models (pydantic only).

The server's routes declare these as their request and response models (so
``/openapi.json`` documents every shape), the engine builds its results as
``RolloutResult``, and the client validates what the server answers with them. This
package imports nothing else of rollserve: a trainer can use it with the client alone.

- ``requests``: what a trainer sends (``SubmitRequest``, ``TaskRequest``,
  ``SamplingParams``, ``AgentLimits``, ``Timeouts``, ...).
- ``result``: a finished rollout (``RolloutResult``, ``Trajectory``, ``Turn``,
  ``Tokens``, ``AuxiliaryCall``, ``Failure``, ...).
- ``calls``: how a gateway session tells a harness's main-loop calls from its
  auxiliary ones (``GatewayCalls``).
- ``views``: what the rollout routes answer (``RolloutView``, ``GroupView``,
  ``ResultsPage``, ``ServiceStatus``, ...); ``llm``: the inference routes'.
- ``dashboard``: what the dashboard's data routes answer (``ResultSummaryPage``,
  ``TokenTexts``).
- ``prorl``: ProRL Agent Server's shapes (``rollserve serve --prorl``).
- ``validation``: the JSON every part of rollserve can hold, and field names as a
  user writes them (``tasks[0].instance.question``).
"""

from rollserve.contract.calls import GatewayCalls
from rollserve.contract.dashboard import (
    FailureFilter,
    ResultSummary,
    ResultSummaryPage,
    TokenTexts,
)
from rollserve.contract.llm import (
    BackendAdded,
    BackendDrained,
    BackendInfo,
    BackendList,
    BackendRemoved,
    BackendState,
    BackendUndrained,
    LastWeightLoad,
    Paused,
    Resumed,
    RouterStatus,
    WeightsLoaded,
)
from rollserve.contract.requests import (
    MAX_WAIT,
    AgentLimits,
    JSONObject,
    PauseRequest,
    ResumeRequest,
    RunRequest,
    SamplingParams,
    SubmitRequest,
    TaskRequest,
    Timeouts,
    Weights,
    WeightsRequest,
)
from rollserve.contract.result import (
    ROLLOUT_STATUSES,
    STAGES,
    TERMINAL,
    AuxiliaryCall,
    ChatMessage,
    Failure,
    FailureKind,
    FailureStage,
    Fidelity,
    RolloutResult,
    RolloutStatus,
    Stage,
    Stats,
    TerminalStatus,
    Timing,
    Tokens,
    ToolCall,
    Trajectory,
    Turn,
)
from rollserve.contract.views import (
    Accepted,
    CancelResponse,
    EngineStatus,
    GroupCancelResponse,
    GroupCounters,
    GroupCounts,
    GroupMember,
    GroupReason,
    GroupView,
    Health,
    NodesChanged,
    NodeStatus,
    ReapSummary,
    Recovered,
    ResultsPage,
    RolloutView,
    RunResponse,
    SandboxStatus,
    ServiceStatus,
    StageStatus,
    StateEvent,
    SubmitResponse,
    TrajectoryCounters,
)

__all__ = [
    "MAX_WAIT", "ROLLOUT_STATUSES", "STAGES", "TERMINAL", "Accepted", "AgentLimits",
    "AuxiliaryCall",
    "BackendAdded", "BackendDrained", "BackendInfo", "BackendList", "BackendRemoved",
    "BackendState", "BackendUndrained", "CancelResponse", "ChatMessage", "EngineStatus",
    "Failure", "FailureFilter", "FailureKind", "FailureStage", "Fidelity", "GroupCancelResponse",
    "GatewayCalls", "GroupCounters", "GroupCounts", "GroupMember", "GroupReason", "GroupView", "Health",
    "JSONObject", "LastWeightLoad", "NodeStatus", "NodesChanged", "PauseRequest", "Paused", "ReapSummary",
    "Recovered", "ResultSummary", "ResultSummaryPage", "ResultsPage", "ResumeRequest",
    "Resumed", "RolloutResult", "RolloutStatus", "RolloutView",
    "RouterStatus", "RunRequest", "RunResponse", "SamplingParams", "SandboxStatus",
    "ServiceStatus", "Stage", "StageStatus", "StateEvent", "Stats", "SubmitRequest",
    "SubmitResponse", "TaskRequest", "TerminalStatus", "Timeouts", "Timing", "TokenTexts",
    "Tokens", "ToolCall", "Trajectory", "TrajectoryCounters", "Turn", "Weights", "WeightsLoaded",
    "WeightsRequest",
]
