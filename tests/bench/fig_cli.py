"""Figure 9: CLI latency, the wall time of one ``piwf`` command as a user's shell runs it.

Each command is a fresh process of the installed ``piwf`` entry point (the console script next
to this interpreter), timed from ``Popen`` to exit: interpreter start, imports, the request (for
``run list``, one connection and one ``run.list`` against a real running server holding
:data:`FULL_RUNS` completed two-node runs), rendering and exit. Output goes to a pipe that is
drained, so rendering costs what it costs, but no terminal does.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from tests.bench.common import BenchError, Figure, percentile, scratch_dir
from tests.bench.fig_runs import Context, completed, submit_runs
from tests.bench.piwf_side import PiwfServer, server_environment, two_node_workflow

#: Completed runs in the server's database for ``piwf run list`` (one default page is 50).
FULL_RUNS = 50
SMOKE_RUNS = 3
#: Timed invocations of each command (after one untimed warm-up, which fills the OS caches),
#: taken round-robin over the commands.
FULL_SAMPLES = 20
SMOKE_SAMPLES = 2
COMMAND_TIMEOUT_S = 60.0

COMMANDS: dict[str, list[str]] = {
    "piwf --version": ["--version"],
    "piwf --help": ["--help"],
    "piwf run list": ["run", "list"],
    "piwf run list --json": ["run", "list", "--json"],
}
#: What any command costs before piwf's own work, on the same interpreter: its start, and the
#: imports of click and of pydantic (a command that talks to a server through the full client
#: validates frames with pydantic models; --version, --help and ``run list``'s quick path, its
#: human output, need none). ``from pydantic import
#: BaseModel`` loads pydantic's model machinery only in part: the first model class a process
#: defines imports the rest (schema generation, the field types), so the last row, one model
#: defined and one value validated, is the floor of any command that validates a frame.
FLOORS: dict[str, str] = {
    "floor: python -c pass": "pass",
    "floor: import click": "import click",
    "floor: import click, pydantic.BaseModel": "import click; from pydantic import BaseModel",
    "floor: import click, one pydantic model validated": (
        "import click\n"
        "from pydantic import BaseModel\n"
        "class Frame(BaseModel):\n"
        "    kind: str\n"
        "Frame.model_validate({'kind': 'response'})"
    ),
}


def installed_piwf() -> Path:
    """The ``piwf`` console script of this interpreter's environment."""
    script = Path(sysconfig.get_path("scripts")) / "piwf"
    if not script.is_file():
        raise BenchError(f"no piwf console script in {script.parent}: install piwf first")
    return script


def time_command(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall seconds from start to exit of one ``command`` process, and the CPU seconds (user and
    system) it used; it must exit 0. CPU time hardly grows when other work shares the cores,
    which stretches wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    finished = subprocess.run(
        command,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    elapsed = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if finished.returncode != 0:
        raise BenchError(
            f"{' '.join(command)} exited {finished.returncode}: "
            f"{finished.stderr.decode(errors='replace')[-500:]}"
        )
    return elapsed, cpu


def figure_cli(context: Context) -> Figure:
    sizes = context.sizes
    runs = SMOKE_RUNS if sizes.smoke else FULL_RUNS
    samples = SMOKE_SAMPLES if sizes.smoke else FULL_SAMPLES
    figure = Figure(
        9,
        f"CLI latency: one command, a new process each time ({samples} runs each, ms)",
        ["command", "median", "p90", "min", "max", "CPU median"],
    )
    piwf = installed_piwf()
    with scratch_dir() as workdir:
        workflow = two_node_workflow(workdir)
        with PiwfServer(workdir / "h") as server, server.client() as client:
            for run_id in submit_runs(client, workflow, runs, sizes.submit_threads):
                completed(client, run_id)
            env = server_environment(server.home)
            # An installed piwf has its bytecode compiled (pip does it at install); in a
            # development install the untimed first run writes it, unless the caller's shell
            # forbids that, which would time compiling every module on every run.
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            commands = {name: [str(piwf), *arguments] for name, arguments in COMMANDS.items()}
            commands.update({name: [sys.executable, "-c", code] for name, code in FLOORS.items()})
            for command in commands.values():
                time_command(command, env, workdir)
            # Round-robin, so a burst of load elsewhere on the machine touches every row alike.
            found: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
            for _ in range(samples):
                for name, command in commands.items():
                    found[name].append(time_command(command, env, workdir))
            for name, timed in found.items():
                values = [wall for wall, _ in timed]
                median, p90 = percentile(values, 50), percentile(values, 90)
                cpu = percentile([used for _, used in timed], 50)
                figure.add(
                    [
                        name,
                        f"{median * 1000:.0f}",
                        f"{p90 * 1000:.0f}",
                        f"{min(values) * 1000:.0f}",
                        f"{max(values) * 1000:.0f}",
                        f"{cpu * 1000:.0f}",
                    ],
                    name,
                    {
                        "medianS": median,
                        "p90S": p90,
                        "minS": min(values),
                        "maxS": max(values),
                        "cpuMedianS": cpu,
                        "samples": samples,
                    },
                )
    figure.settings = {
        "entry point": "the installed piwf console script, run with subprocess (stdout a pipe)",
        "server": f"a running piwf server holding {runs} completed two-node runs",
        "run list": "the default page (--limit 50), human output (the quick read, no pydantic)",
        "run list --json": "the same page through the full client, validated with the models",
        "CPU median": "user + system time of the process (steadier than wall time on a busy"
        " machine)",
    }
    figure.notes.append("each command ran once untimed first (OS page cache warm, .pyc written)")
    figure.notes.append(
        "floor rows: the same interpreter, only starting and importing (the last also defines"
        " one model and validates one value)"
    )
    return figure
