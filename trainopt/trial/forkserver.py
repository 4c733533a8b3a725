"""A fork server for live trial processes ("arms"): ``python -m trainopt.trial.forkserver FD [TAG]``.

A fresh trial process pays about 4 s for the interpreter, ``import torch`` and dynamo
before its first step. This process pays that once: it imports torch and trainopt's
trial-side modules, runs no torch operation (so no OpenMP pool, no CUDA context and no
threads of torch's own exist), and then forks one child per arm on request. A child
starts in well under a second and builds its own model, loader workers and compile.

The orchestrator talks to it over one Unix socket (the inherited descriptor ``FD``):

- ``{"op": "spawn", "preload": [MODULE, ...]}`` with two descriptors attached (the arm's
  control socket and its log file) -> ``{"pid": PID}``. The modules named (optional;
  ``COMPILER_PRELOAD`` for an arm that compiles) are imported here first, once, so every later arm
  that needs them finds them imported. The child leads a new session (own process group, so
  the orchestrator can pause it and its loader workers with one ``killpg``), writes
  stdout and stderr to the log, and serves ``trainopt.trial.arm`` on the control socket.
- ``{"op": "wait", "pid": PID}`` -> ``{"pid": PID, "returncode": RC}`` after the child
  has ended (negative for a signal), so a crash is classified like a fresh process's.

Environment variables that the OpenMP runtime reads when it is loaded (for example
``OMP_WAIT_POLICY``) must be set in this process's environment: the children inherit
the runtime as loaded here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

from trainopt.contract.boundary import ARM_PRELOAD, FORKSERVER_PARENT_VAR
from trainopt.trial.lifeline import die_with_parent, watch_parent

__all__ = ["main"]


def _kill_arms(arms: set[int]) -> None:
    """SIGKILL every arm's process group: the arm and its loader workers, stopped ones included.

    An arm killed alone would leave its stopped loader workers behind, since nothing
    resumes a stopped process whose parent has gone.
    """
    for pid in arms:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue


def _child(control_fd: int, log_fd: int, server: socket.socket) -> None:
    """Become an arm: new session, output to the log, serve the control socket; never returns."""
    code = 70
    try:
        server.close()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        os.setsid()
        die_with_parent()
        arm_pid = os.getpid()
        # Loader workers (every process this arm forks) die with the arm too: a paused arm's
        # workers are stopped, and if the arm is killed (its launcher killed at once with its
        # orchestrator, as a node's process manager does) nothing would ever resume or end
        # them; the kernel's orphaned-group rule does not apply, since the arm leads its own
        # session. The check after prctl covers an arm that died before it.
        os.register_at_fork(after_in_child=lambda: (die_with_parent(), os.getppid() != arm_pid and os._exit(70)))
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from trainopt.trial import arm

        code = arm.serve(control_fd)
    except BaseException:  # noqa: BLE001 - a child must never fall back into the server loop
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            # Skip interpreter teardown: loader workers and compile caches need none.
            os._exit(code)


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


# The arms not yet waited for (the watchdog kills them if the orchestrator is gone).
_ARMS: set[int] = set()


def _orphaned() -> None:
    """The orchestrator is gone (the watchdog saw another parent): kill every arm and end at once."""
    _kill_arms(set(_ARMS))
    os._exit(0)


def serve(server: socket.socket) -> None:
    """Answer spawn and wait requests until the orchestrator closes the socket.

    When the orchestrator goes (its socket closes, SIGTERM arrives because it died, or the
    watchdog sees another parent), every arm not yet waited for is killed with its loader
    workers.
    """
    arms = _ARMS
    try:
        _serve(server, arms)
    finally:
        _kill_arms(arms)


def _serve(server: socket.socket, arms: set[int]) -> None:
    ended: dict[int, int] = {}
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(server, 65536, 4)
        except (ConnectionResetError, OSError):
            return
        if not data:
            return
        msg = json.loads(data)
        if msg["op"] == "spawn":
            control_fd, log_fd = fds
            _preload(msg.get("preload") or ())
            pid = os.fork()
            if pid == 0:
                _child(control_fd, log_fd, server)
            arms.add(pid)
            os.close(control_fd)
            os.close(log_fd)
            reply = {"pid": pid}
        elif msg["op"] == "wait":
            pid = int(msg["pid"])
            if pid not in ended:
                try:
                    _, status = os.waitpid(pid, 0)
                    ended[pid] = _returncode(status)
                except ChildProcessError:
                    ended[pid] = 0
                arms.discard(pid)
            reply = {"pid": pid, "returncode": ended.pop(pid)}
        else:
            for fd in fds:
                os.close(fd)
            reply = {"error": f"unknown op {msg.get('op')!r}"}
        server.sendall(json.dumps(reply).encode())


def _preload(names) -> None:
    """Import the modules an arm asked for before it is forked (a failed import is the arm's to report)."""
    import importlib

    for name in names:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the arm imports it again and fails with a traceback in its log
                pass


def _end() -> None:
    """Kill every arm and leave at once, without interpreter teardown.

    The teardown of a process that has imported torch and dynamo can block in C code (a
    thread join, a lock), where no Python signal handler runs, the watchdog's included:
    a launcher stuck there would outlive its orchestrator.
    """
    _kill_arms(set(_ARMS))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def _on_sigterm(signum, frame) -> None:
    _end()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    server = socket.socket(fileno=int(argv[0]))
    # Ctrl-C goes to the whole foreground group; the orchestrator decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    parent = int(os.environ.get(FORKSERVER_PARENT_VAR) or os.getppid())
    die_with_parent(signal.SIGTERM)
    # The parent-death signal alone can be lost; the watchdog kills every arm when it is.
    watch_parent(parent, _orphaned)
    import importlib

    for name in ARM_PRELOAD:
        importlib.import_module(name)
    server.sendall(json.dumps({"ready": os.getpid()}).encode())
    try:
        serve(server)
    finally:
        _end()
    return 0


if __name__ == "__main__":
    sys.exit(main())
