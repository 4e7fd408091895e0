"""The state layer's own vocabularies, one enum per ``CHECK (... IN (...))`` list of the DDL.

A lifecycle that another layer names too (run status, commands, requests, notifications, effect
status) lives in :mod:`piwf.lifecycle` instead. A test compares each enum, here and there, with
its CHECK constraint, so the two cannot drift apart.
"""

from __future__ import annotations

from piwf.lifecycle import StrEnum


class ResourceType(StrEnum):
    """Kinds of aggregate that own a revision in ``resources``."""

    RUN = "run"
    EFFECT = "effect"
    DECISION = "decision"
    MANAGED_RESOURCE = "managed_resource"
    SESSION = "session"
    CHANNEL = "channel"
    SERVER = "server"
    SYSTEM = "system"
    #: A live-settings scope (:mod:`piwf.state.execution.settings`).
    SETTINGS = "settings"


class OwnerType(StrEnum):
    """Who may hold a claim in ``leases``."""

    SERVER = "server"
    CONTROL = "control"
    RESOURCE_MANAGER = "resource_manager"
    SESSION = "session"
    CHANNEL = "channel"
    SYSTEM = "system"


class ActorType(StrEnum):
    """Who caused an event."""

    SERVER = "server"
    RUNNER = "runner"
    CLIENT = "client"
    CONTROL = "control"
    HUMAN = "human"
    POLICY = "policy"
    RESOURCE_MANAGER = "resource_manager"
    SESSION = "session"
    CHANNEL = "channel"
    SYSTEM = "system"


class MediaType(StrEnum):
    """Media types a blob may have."""

    JSON = "application/json"
    TEXT = "text/plain"


class EffectRecovery(StrEnum):
    """What happens to an effect whose outcome became uncertain."""

    IDEMPOTENT = "idempotent"  # return to pending and retry under the same key
    MANUAL = "manual"  # become ambiguous; only an operator moves it
    OBSERVE = "observe"  # become ambiguous; its owner observes the outside world before acting


class EffectOwnerScope(StrEnum):
    """Which kind of aggregate an effect belongs to."""

    RUN = "run"
    RESOURCE_MANAGER = "resource_manager"
    CHANNEL = "channel"
    SYSTEM = "system"


class EffectAttemptOutcome(StrEnum):
    """How one application attempt ended."""

    APPLIED = "applied"
    REJECTED = "rejected"
    AMBIGUOUS = "ambiguous"
    INTERRUPTED = "interrupted"


class QueueStatus(StrEnum):
    """Status of a run's row in ``run_queue``."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    PARKED = "parked"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AttemptStatus(StrEnum):
    """Status of one node attempt."""

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    INTERRUPTED = "interrupted"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class ExecutionMode(StrEnum):
    """Whether a run belongs to an interactive session or runs headless."""

    INTERACTIVE = "interactive"
    HEADLESS = "headless"


class MessageKind(StrEnum):
    """What a workflow message presents in its origin session's conversation."""

    STEP = "step"  # an agent step or checkpoint for the session's model to act on
    DECISION = "decision"  # a protected human decision (never starts a model turn)
    NOTIFICATION = "notification"  # a notify node's passive message
    TERMINAL = "terminal"  # the run's final outcome
    FOLLOW_UP = "followUp"  # a prompt queued to follow the run


class MessageStatus(StrEnum):
    """A workflow message's state: sent only on branch evidence (an entry id)."""

    PENDING = "pending"
    SENT = "sent"
    CANCELLED = "cancelled"


class TurnState(StrEnum):
    """A workflow turn: open until its end is reported (or proved lost)."""

    STARTED = "started"
    ENDED = "ended"


class TurnStopReason(StrEnum):
    """How a workflow turn ended."""

    COMPLETED = "completed"
    ABORTED = "aborted"  # the person stopped it: the run pauses
    ERROR = "error"
    LOST = "lost"  # proved over without an end report (an idle branch, a newer turn)


class SegmentStatus(StrEnum):
    """A session capture segment: recording until its turn's end is reported."""

    RECORDING = "recording"
    COMPLETE = "complete"
    FAILED = "failed"  # the end proved an interruption (aborted, error, lost)


class AttemptEntryRole(StrEnum):
    """Which captured entry of a node attempt an ``attempt_entries`` row names."""

    PROMPT = "prompt"  # the step message's entry
    RESPONSE = "response"  # the turn's reply entry
    FIRST = "first"
    LAST = "last"


class StepReason(StrEnum):
    """Why a step message presents its request (again)."""

    INITIAL = "initial"
    REMINDER = "reminder"
    RESUMED = "resumed"


class SourceType(StrEnum):
    """Where a run's workflow source came from."""

    FILE = "file"
    BUILTIN = "builtin"


class CommandOutcome(StrEnum):
    """Outcome of a client command, as stored in its receipt and sent on the wire."""

    ACCEPTED = "accepted"
    ADOPTED = "adopted"
    REJECTED = "rejected"
    CONFLICT = "conflict"
    NOT_FOUND = "notFound"
    CLAIM_LOST = "claimLost"
    UNAVAILABLE = "unavailable"


class RunnerStatus(StrEnum):
    """Status of one runner process (``run_runners``): three live states, then one outcome."""

    STARTING = "starting"
    READY = "ready"
    RUNNING = "running"
    EXITED = "exited"
    CANCELLED = "cancelled"
    TIMED_OUT = "timedOut"
    CRASHED = "crashed"
    CLAIM_LOST = "claimLost"
    ORPHANED = "orphaned"


LIVE_RUNNER_STATUSES = frozenset({RunnerStatus.STARTING, RunnerStatus.READY, RunnerStatus.RUNNING})


class RunnerMessageOutcome(StrEnum):
    """Outcome of a state-changing runner message, as stored in its receipt."""

    ACCEPTED = "accepted"
    ADOPTED = "adopted"
    REJECTED = "rejected"
    CLAIM_LOST = "claimLost"


class FailureClass(StrEnum):
    """The closed set of failure classes (``run_queue.error_code``); never reported as another."""

    CLAIM_LOST = "claimLost"
    RUNNER_CRASHED = "runnerCrashed"
    RUNNER_NO_PROGRESS = "runnerNoProgress"
    RUNNER_TIMED_OUT = "runnerTimedOut"
    SERVER_UNAVAILABLE = "serverUnavailable"
    SOURCE_CHANGED = "sourceChanged"
    EFFECT_AMBIGUOUS = "effectAmbiguous"
    NODE_FAILED = "nodeFailed"
    #: The workflow's input parser refused the run's input before any step (never
    #: ``nodeFailed``: no node failed, and a restart would give it the same input).
    INPUT_REJECTED = "inputRejected"
    PROTOCOL_REJECTED = "protocolRejected"


#: Consecutive runner crashes (no node finished in between) after which a ``runnerCrashed`` run
#: is no longer relaunched (the scheduler skips it until an explicit resume): a deterministic
#: crash never loops forever.
CRASH_LOOP_LIMIT = 5

#: Queue error codes that keep a run away from the scheduler until an explicit resume (a
#: ``runnerCrashed`` run is kept away too once its crash streak reaches ``CRASH_LOOP_LIMIT``).
BLOCKING_FAILURE_CLASSES = frozenset(
    {
        FailureClass.SOURCE_CHANGED,
        FailureClass.RUNNER_NO_PROGRESS,
        FailureClass.EFFECT_AMBIGUOUS,
        FailureClass.PROTOCOL_REJECTED,
    }
)


class InteractionStatus(StrEnum):
    """``pending -> answered -> settled``; ``answered -> pending`` on a rejected answer."""

    PENDING = "pending"
    ANSWERED = "answered"
    SETTLED = "settled"
    CANCELLED = "cancelled"


class DecisionKind(StrEnum):
    """Which request a ``human_decisions`` row audits; only ``human_decision`` is protected."""

    CHECKPOINT = "checkpoint"
    HUMAN_DECISION = "human_decision"


class ResolutionOutcome(StrEnum):
    """The single winning fact of a decision: its response was accepted, or it was cancelled."""

    ACCEPTED = "accepted"
    CANCELLED = "cancelled"


class ResolutionProvenance(StrEnum):
    """Where the winner came from; the first two accept, the last two cancel."""

    HUMAN = "human"
    CLIENT = "client"
    TIMEOUT_POLICY = "timeout_policy"
    EXPLICIT_CANCEL = "explicit_cancel"
    EXPIRED_NO_DEFAULT = "expired_no_default"


#: Provenances whose resolution is ``accepted`` (the others are ``cancelled``).
ACCEPTING_PROVENANCES = frozenset(
    {ResolutionProvenance.HUMAN, ResolutionProvenance.CLIENT, ResolutionProvenance.TIMEOUT_POLICY}
)


class SubmissionSource(StrEnum):
    """Who proposed a candidate; only ``human`` may settle a protected decision."""

    HUMAN = "human"
    CLIENT = "client"
    WORKFLOW = "workflow"
    POLICY = "policy"
    CONTROL = "control"


class SubmissionOutcome(StrEnum):
    """What became of one candidate answer."""

    WON = "won"
    ADOPTED = "adopted"
    ALREADY_RESOLVED = "already_resolved"
    REJECTED = "rejected"


class AgentSubmissionOutcome(StrEnum):
    """What became of one candidate output of an agent request (``interactive_submissions``)."""

    VALIDATING = "validating"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class ResourceQueueReason(StrEnum):
    """Why a managed resource sits in ``managed_resource_queue``."""

    APPLIED = "applied"
    REQUESTED = "requested"
    REQUEUE = "requeue"
    REQUEUE_AFTER = "requeueAfter"
    CONFLICT = "conflict"
    ERROR = "error"
    CHILD_FINISHED = "childFinished"
    DELETING = "deleting"
    INTERRUPTED = "interrupted"


class ResourceRunnerStatus(StrEnum):
    """Status of one resource-runner process: two live states, then one outcome."""

    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"
    TIMED_OUT = "timedOut"
    CRASHED = "crashed"
    CLAIM_LOST = "claimLost"
    ORPHANED = "orphaned"


LIVE_RESOURCE_RUNNER_STATUSES = frozenset(
    {ResourceRunnerStatus.STARTING, ResourceRunnerStatus.RUNNING}
)


class ReconcileOutcome(StrEnum):
    """What one reconcile's result did (``managed_resource_runners.result``)."""

    SETTLED = "settled"
    REQUEUE = "requeue"
    REQUEUE_AFTER = "requeueAfter"
    DELETED = "deleted"
    CONFLICT = "conflict"
    FAILED = "failed"


class AgentProcessEnd(StrEnum):
    """How a registered agent command process left the registry (``agent_processes``)."""

    UNREGISTERED = "unregistered"  # its runner shut the group down and said so
    REAPED = "reaped"  # the server ended it: its runner ended first, or its server died


class ChannelAdapterType(StrEnum):
    """The kinds of external channel an adapter child speaks (``channels.adapter_type``)."""

    TELEGRAM = "telegram"


class ChannelMessagePurpose(StrEnum):
    """What a ``channel_messages`` row shows: the decision itself, or how it was settled."""

    DELIVERY = "delivery"
    SETTLEMENT = "settlement"


class ChannelMessageStatus(StrEnum):
    """Where a channel message stands; mirrors its effect (``ambiguous``: maybe sent)."""

    PENDING = "pending"
    CONFIRMED = "confirmed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"
