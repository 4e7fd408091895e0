"""Errors of workflows: definitions, files, run commands, answers, agent submissions, sessions
and live settings (the ``WorkflowError`` branch of :mod:`piwf.errors`)."""

from __future__ import annotations

from piwf.errors.base import PiwfError


class WorkflowError(PiwfError):
    """A problem with a workflow definition, file or run command."""

    code = "workflowError"


class WorkflowDefinitionError(WorkflowError):
    """A workflow definition breaks an authoring rule; the message names the rule."""

    code = "workflowDefinition"


class WorkflowLoadError(WorkflowError):
    """A workflow file could not be loaded; the message names the file and the problem."""

    code = "workflowLoad"


class RunCommandError(WorkflowError):
    """A run command does not fit the saved run state; no workflow code ran."""

    code = "runCommand"


class RunPausedError(RunCommandError):
    """The run is paused: answers, submissions and updates wait until it is resumed."""

    code = "runPaused"


class AnswerRejectedError(WorkflowError):
    """An answer does not fit its request (choices, protection, status); nothing settled."""

    code = "answerRejected"


class NotDecisionRequestError(WorkflowError):
    """An agent step's request takes a submitted output (``piwf submit``), not an answer."""

    code = "notDecisionRequest"


class SubmissionError(WorkflowError):
    """An agent submission was refused before or by validation; nothing else changed."""

    code = "submissionError"


class RequestNotOpenError(SubmissionError):
    """The request is answered, closed, or belongs to an attempt that is no longer active."""

    code = "requestNotOpen"


class NotAgentRequestError(SubmissionError):
    """A submission named a checkpoint or decision; those are answered (``piwf answer``)."""

    code = "notAgentRequest"


class ValidationPendingError(SubmissionError):
    """Another candidate of the request is being validated; wait for its outcome first."""

    code = "validationPending"


class RequestRunMismatchError(SubmissionError):
    """The frame's run id is not the run of the request it names."""

    code = "requestRunMismatch"


class SubmissionKeyConflictError(SubmissionError):
    """The idempotency key was already used for another output of the same request."""

    code = "idempotencyConflict"


class SubmissionRejectedError(SubmissionError):
    """The candidate was rejected (its ``validate`` refused it, or its validation stopped); the
    request stays pending and the message says what to submit instead."""

    code = "submissionRejected"


class AgentCommandError(WorkflowError):
    """An agent command is not a list of non-empty strings (or ``'CMD ARGS'`` that splits into
    one); nothing was sent or started."""

    code = "agentCommand"


class MissingSubmissionError(WorkflowError):
    """An agent step's command ended three turns (two of them reminders) without an accepted
    submission: the attempt failed. Its code starts the node's error text."""

    code = "missingSubmission"


class SessionError(WorkflowError):
    """An interactive session's rule was broken; nothing changed."""

    code = "sessionError"


class SessionBusyError(SessionError):
    """The session is reserved by another unfinished interactive run (one at a time)."""

    code = "sessionBusy"


class SessionAuthorityError(SessionError):
    """The request needs the session's active coordinator epoch, and did not carry it."""

    code = "sessionAuthority"


class SettingsChangeError(WorkflowError):
    """A live-settings change was refused; nothing changed. The message says why."""

    code = "settingsRefused"


class SettingsConflictError(SettingsChangeError):
    """A live-settings change was based on another change than the newest."""

    code = "settingsConflict"
