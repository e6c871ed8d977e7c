"""The launcher the rendered launch line calls: ``python -m malletrain.elastic.restart.launch
ARGV...``, with the shell's evaluated argument list.

The generation it runs in comes from the node agent's environment (``MALLETRAIN_NNODES``,
``MALLETRAIN_NODE_RANK``, ``MALLETRAIN_MASTER_ADDR``, ``MALLETRAIN_MASTER_PORT``,
``MALLETRAIN_NODES``, ``MALLETRAIN_WORKERS_PER_NODE``, ``MALLETRAIN_RUN_DIR``). torchrun,
accelerate and deepspeed replace this process (``exec``, after writing the launch's own
files: deepspeed's hostfile). It runs only inside a task's ``bash -c "$LAUNCHER ..."``
string (:mod:`.task`); ``srun python`` tasks are Slurm's own (:mod:`.srun`).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence

from malletrain.elastic.restart.launchers import Generation, Launch, LaunchError, plan_launch

#: signals passed on to ``srun python`` tasks (the agent's stop signal among them)
_FORWARD = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def generation_from_env(env: Mapping[str, str]) -> Generation:
    try:
        nodes = tuple(n for n in env["MALLETRAIN_NODES"].split(",") if n)
        return Generation(
            nnodes=int(env["MALLETRAIN_NNODES"]), node_rank=int(env["MALLETRAIN_NODE_RANK"]),
            master_addr=env["MALLETRAIN_MASTER_ADDR"],
            master_port=int(env["MALLETRAIN_MASTER_PORT"]), nodes=nodes,
            workers_per_node=int(env.get("MALLETRAIN_WORKERS_PER_NODE", "1")),
            run_dir=env.get("MALLETRAIN_RUN_DIR", ""))
    except (KeyError, ValueError) as exc:
        raise LaunchError(f"not started by a malletrain node agent ({exc})") from None


def write_files(launch: Launch) -> None:
    """The launch's own files (deepspeed's hostfile), in the agent's private directory:
    created 0600, never through a link."""
    for path, text in launch.files:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    try:
        launch = plan_launch(args, generation_from_env(os.environ))
        write_files(launch)
    except LaunchError as exc:
        print(f"malletrain launch: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"malletrain launch: cannot write {exc.filename}: {exc.strerror}",
              file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # an argument list, never a shell string: the shell already expanded the line
        os.execvpe(launch.argv[0], list(launch.argv), {**os.environ, **launch.env})  # noqa: S606
    except OSError as exc:
        print(f"malletrain launch: cannot run {launch.argv[0]!r}: {exc.strerror}",
              file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
