"""The execution store: the durable half of the workflow port, and the run transitions around it.

The server runs each run generation in a child process. The child's engine calls the port
(:class:`piwf.workflow.port.WorkflowPort`); every call crosses the runner pipe and the server
applies it here, each in one ``BEGIN IMMEDIATE`` transaction that checks and renews the exact
live run claim, bumps the run revision once, writes one event and returns a typed result::

    scheduler ─claim_next_run──▶ RunLaunch(claim, command) ─record_runner_launch─▶ spawn
      ─record_runner_process─▶ ─mark_runner_ready─▶ send the one command
    runner message ─decode_runner_call─▶ apply_runner_call(receipt, the runner's own claim)
      ─▶ apply_begin_run | apply_node_started | ...
      | apply_reserve_effect | apply_settle_effect | ... | apply_park | apply_finish
    runner exit ─close_runner_and_recover─▶ record_runner_exit + recover_after_runner_exit
      (no-progress rule, effects)
    client control ─cancel_run | pause_run | resume_run | restart_run

This package is the public surface; the functions live in its modules, which import one
another by full path (``piwf.state.execution.core``), never through this facade. The stores
each write their own tables and nothing else; the transitions hold no SQL and compose the
stores (and ``leases``, ``records``, ``effects``, ``decisions``) into one guarded change:

==================  ======================================================================
store               tables it writes (and the row type it reads them as)
==================  ======================================================================
``runs``            runs, run_sources, run_bindings, projects, workflow_definitions
                    (:class:`~piwf.state.execution.runs.RunRow`, with the queue row)
``queue``           run_queue; the scheduler's eligibility queries
``attempts``        node_attempts, run_steps (``AttemptRow``)
``requests``        interactive_requests (``RequestRow``)
``updates``         workflow_updates, run_notifications
``runners``         run_runners, runner_messages (``RunnerRecord``, ``RunnerReply``)
==================  ======================================================================

==================  ======================================================================
transition          contents
==================  ======================================================================
``core``            run authority, the run change, :class:`RunLaunch`, closing a run
``calls``           one runner call decoded and applied under the runner's own claim
``visits``          :func:`read_saved_run`, begin, node started/finished/failed, updates,
                    notifications
``effects``         effect reservation and settlement
``outcomes``        interactive requests, park, finish
``control``         scheduling claim, cancel, pause, resume, restart
``recovery``        a runner's end (exit row and run decision), no-progress and
                    source-change parks
``answers``         answers to checkpoints and decisions, decision deadlines, audits
``expiries``        active-time deadlines of agent requests and their expiry
==================  ======================================================================

``docs/EXECUTION_STATE.md`` describes the tables, the claim rules and every transition.
"""

from __future__ import annotations

from piwf.state.enums import CRASH_LOOP_LIMIT
from piwf.state.execution.answers import (
    AnswerOutcome,
    DecisionAudit,
    OpenRequest,
    answer_request,
    expire_due_decisions,
    list_open_requests,
    paused_run_of_request,
    run_decision_audit,
)
from piwf.state.execution.calls import (
    RunnerCall,
    RunnerCallRejectedError,
    apply_runner_call,
    decode_runner_call,
)
from piwf.state.execution.control import (
    cancel_run,
    claim_next_run,
    count_runnable,
    has_scheduled_work,
    pause_run,
    restart_run,
    resume_run,
)
from piwf.state.execution.core import RunLaunch
from piwf.state.execution.effects import apply_reserve_effect, apply_settle_effect
from piwf.state.execution.expiries import (
    AgentDeadline,
    Expiry,
    agent_deadline,
    count_open_agent_deadlines,
    expire_agent_request,
    expire_due_agent_requests,
    next_agent_deadline,
    pending_agent_deadlines,
)
from piwf.state.execution.outcomes import (
    apply_finish,
    apply_park,
    apply_request_interaction,
)
from piwf.state.execution.queue import ExpiredRun, expired_running_runs, next_due_at
from piwf.state.execution.recovery import (
    RecoveryDecision,
    RunRecovery,
    clear_stale_pauses,
    close_runner_and_recover,
    crash_backoff_ms,
    park_for_no_progress,
    park_for_source_change,
    recover_after_runner_exit,
)
from piwf.state.execution.runners import (
    RunnerRecord,
    RunnerReply,
    apply_runner_message,
    get_runner,
    list_runners,
    live_runner,
    mark_runner_ready,
    orphaned_runners,
    record_runner_exit,
    record_runner_launch,
    record_runner_process,
)
from piwf.state.execution.visits import (
    SavedRunHead,
    apply_begin_run,
    apply_node_failed,
    apply_node_finished,
    apply_node_started,
    apply_notify,
    apply_publish_update,
    read_saved_run,
    read_saved_run_head,
    read_saved_steps,
)

__all__ = [
    "CRASH_LOOP_LIMIT",
    "AgentDeadline",
    "AnswerOutcome",
    "DecisionAudit",
    "ExpiredRun",
    "Expiry",
    "OpenRequest",
    "RecoveryDecision",
    "RunLaunch",
    "RunRecovery",
    "RunnerCall",
    "RunnerCallRejectedError",
    "RunnerRecord",
    "RunnerReply",
    "SavedRunHead",
    "agent_deadline",
    "answer_request",
    "apply_begin_run",
    "apply_finish",
    "apply_node_failed",
    "apply_node_finished",
    "apply_node_started",
    "apply_notify",
    "apply_park",
    "apply_publish_update",
    "apply_request_interaction",
    "apply_reserve_effect",
    "apply_runner_call",
    "apply_runner_message",
    "apply_settle_effect",
    "cancel_run",
    "claim_next_run",
    "clear_stale_pauses",
    "close_runner_and_recover",
    "count_open_agent_deadlines",
    "count_runnable",
    "crash_backoff_ms",
    "decode_runner_call",
    "expire_agent_request",
    "expire_due_agent_requests",
    "expire_due_decisions",
    "expired_running_runs",
    "get_runner",
    "has_scheduled_work",
    "list_open_requests",
    "list_runners",
    "live_runner",
    "mark_runner_ready",
    "next_agent_deadline",
    "next_due_at",
    "orphaned_runners",
    "park_for_no_progress",
    "park_for_source_change",
    "pause_run",
    "paused_run_of_request",
    "pending_agent_deadlines",
    "read_saved_run",
    "read_saved_run_head",
    "read_saved_steps",
    "record_runner_exit",
    "record_runner_launch",
    "record_runner_process",
    "recover_after_runner_exit",
    "restart_run",
    "resume_run",
    "run_decision_audit",
]
