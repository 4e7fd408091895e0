"""Built-in ``noop``: one compute node that returns its input; a clean end-to-end check."""

from piwf.workflow import compute, define_workflow

workflow = define_workflow(
    name="noop",
    start_at="echo",
    nodes={"echo": compute(lambda ctx: {"input": ctx.input})},
    edges=[],
)
