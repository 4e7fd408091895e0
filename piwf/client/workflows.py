"""``Client`` methods that show which workflows ``run.start NAME`` finds, and what one is."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from piwf.client.arguments import build_payload, project_argument
from piwf.client.calls import ClientCalls
from piwf.client.runs import workflow_reference

if TYPE_CHECKING:
    from piwf.protocol.workflow_payloads import WorkflowDescription, WorkflowList

_Receipt = TypeVar("_Receipt", bound=BaseModel)


class WorkflowMethods(ClientCalls):
    """Workflow discovery (``workflow.list``, ``workflow.show``)."""

    def list_workflows(self, *, project: str | os.PathLike[str] | None = None) -> WorkflowList:
        """Every workflow ``start_run(NAME)`` finds from ``project`` (default: the current
        directory), in discovery order: the project's ``.piwf/workflows/``, the state home's
        ``workflows/``, then the built-ins; ``directories`` lists where it looked. No workflow
        code is loaded."""
        from piwf.protocol.workflow_payloads import WorkflowList, WorkflowListPayload

        payload = build_payload(WorkflowListPayload, project_path=_project_path(project))
        return self._call("workflow.list", payload, WorkflowList)

    def show_workflow(
        self, workflow: str | os.PathLike[str], *, project: str | os.PathLike[str] | None = None
    ) -> WorkflowDescription:
        """Load ``workflow`` (a name, discovered as :meth:`start_run` does, or a file path) in
        a resolver child and describe it: nodes, edges, exits, mounts and input contract.

        Raises :class:`~piwf.errors.RejectedError` with ``error_code`` ``workflowLoad`` and the
        loader's message when the file does not load or no workflow has that name.
        """
        from piwf.protocol.workflow_payloads import WorkflowDescription, WorkflowShowPayload

        payload = build_payload(
            WorkflowShowPayload,
            workflow=workflow_reference(workflow),
            project_path=_project_path(project),
        )
        return self._call("workflow.show", payload, WorkflowDescription)


def _project_path(project: str | os.PathLike[str] | None) -> str:
    return str(project_argument(project))
