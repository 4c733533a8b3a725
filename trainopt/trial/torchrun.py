"""``python -m trainopt.trial.torchrun ...``: torchrun itself, recording which rank failed and how.

It parses the same options with torchrun's own parser and runs torchrun's own ``run``, so a
trial is launched exactly as ``torchrun ...`` launches a training script. The one addition:
when ranks fail, their exit codes (negative for a signal) are written as JSON to the file
named by ``TRAINOPT_LAUNCH_STATUS``, because torchrun reports them only as text. And like
every trial process it ends with the orchestrator, whose ``kill -9`` would otherwise leave
the launch and its ranks running.
"""

from __future__ import annotations

import json
import os
import sys

from trainopt.contract.boundary import LAUNCH_STATUS_VAR, PARENT_PID_VAR
from trainopt.trial.lifeline import die_with_parent, expected_parent

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv``; return 0, or 1 after recording the failed ranks."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # The ranks' own parent is this process: they are not told, so a rank must not
    # take the orchestrator's pid as its parent's.
    die_with_parent(parent=expected_parent())
    os.environ.pop(PARENT_PID_VAR, None)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except ChildFailedError as exc:
        path = os.environ.get(LAUNCH_STATUS_VAR)
        if path:
            from trainopt.atomic import write_json_atomic

            write_json_atomic(path, {"failures": {str(rank): f.exitcode for rank, f in exc.failures.items()}})
        print(f"trainopt.trial.torchrun: ranks failed: {json.dumps({r: f.exitcode for r, f in exc.failures.items()})}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
