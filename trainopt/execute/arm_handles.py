"""The orchestrator's handles on a fork server and on the live arms forked from it.

A session's arms are forked from one ``trainopt.trial.forkserver`` process, which has
torch imported already, so an arm starts in a fraction of a second. ``ForkServerHandle``
starts that process and asks it to fork or reap an arm; ``ArmHandle`` is one live arm:
the control connection to it, its pause and resume (SIGSTOP and SIGCONT on its whole
process group, so its DataLoader workers stop with it), its end, and what it has reported
so far. ``classify_reply`` says what an arm's answer, or its silence, means.

Orchestrator side: no torch here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Sequence

from trainopt.contract.boundary import FORKSERVER_MODULE
from trainopt.contract.protocol import SCHEMA_VERSION
from trainopt.execute.runner import classify_exit

__all__ = ["ForkServerHandle", "ArmHandle", "classify_reply"]


def classify_reply(reply: dict[str, Any] | None, *, timed_out: bool, returncode: int | None, timeout_s: float,
                   what: str) -> tuple[str, str] | None:
    """The failure an arm's answer (or silence) means, or None for a normal answer.

    Args:
        reply: The arm's message, or None when it sent none.
        timed_out: The arm did not answer within ``timeout_s``.
        returncode: How the arm process ended, when it ended without answering.
        timeout_s: The limit it had.
        what: What it was doing (``warm-up``, ``window 3``), for the message.

    Returns:
        ``(status, error)`` for a failed arm.
    """
    if timed_out:
        return "timeout", f"the arm did not finish its {what} within {timeout_s:g} s and was stopped"
    if reply is None:
        how = classify_exit(returncode if returncode is not None else -signal.SIGKILL)
        return "crashed", f"{how} during its {what}"
    if reply.get("kind") == "failed":
        return str(reply.get("status", "error")), str(reply.get("error") or "")
    return None


class ForkServerHandle:
    """A running ``trainopt.trial.forkserver`` process and the socket to it.

    Args:
        env: The fork server's environment, which every arm inherits.
        command: The interpreter to run it with, and any prefix (``setarch ... -R``).
        tag: Names the process on its command line (the first session's log folder).

    Raises:
        RuntimeError: The fork server did not start.
    """

    def __init__(self, env: dict[str, str], command: list[str], tag: str = ""):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._out = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            # The tag (the first session's log folder) only names the processes: forked arms keep
            # this command line, so ``ps`` (and the test suite's orphan check) can tell whose they are.
            [*command, "-m", FORKSERVER_MODULE, str(theirs.fileno()), *([tag] if tag else [])],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT, env=env,
        )
        theirs.close()
        self.sock = ours
        self.sock.settimeout(300)
        try:
            hello = self.sock.recv(4096)
        except (socket.timeout, OSError):
            hello = b""
        if not hello:
            self._out.seek(0)
            tail = self._out.read().decode(errors="replace")[-2000:].strip() or f"exit code {self.proc.poll()}"
            self.close()
            raise RuntimeError(f"the arm launcher did not start:\n{tail}")

    def _ask(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        data = json.dumps(message).encode()
        if fds:
            socket.send_fds(self.sock, [data], fds)
        else:
            self.sock.sendall(data)
        reply = self.sock.recv(65536)
        if not reply:
            raise RuntimeError("the arm launcher ended unexpectedly")
        return json.loads(reply)

    def spawn(self, control_fd: int, log_fd: int, preload: Sequence[str] = ()) -> int:
        """Fork an arm that serves ``control_fd`` and writes to ``log_fd``; its pid."""
        message: dict[str, Any] = {"op": "spawn"}
        if preload:
            message["preload"] = list(preload)
        return int(self._ask(message, [control_fd, log_fd])["pid"])

    def wait(self, pid: int) -> int:
        """Wait for the arm ``pid`` to end; how it ended (negative for a signal)."""
        return int(self._ask({"op": "wait", "pid": pid})["returncode"])

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Close the socket, which ends the fork server and its arms, and wait for it."""
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._out.close()


def _kill_group(pid: int) -> None:
    """SIGKILL the arm's process group (the arm and its loader workers), stopped or not."""
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
            return
        except (ProcessLookupError, PermissionError):
            continue


def _is_gone(pid: int) -> bool:
    """True once the arm process has ended (a zombie of the fork server counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    except OSError:
        return False


class ArmHandle:
    """The orchestrator's handle on one live arm; making it forks the arm.

    Args:
        index: The arm's request index in its session.
        fork_server: The fork server to fork it from.
        log_path: Where the arm's output goes (appended).
        preload: Modules the fork server imports before forking it (``session_plan.arm_preload``).

    Attributes:
        pid: The arm's process, the leader of its own process group.
        ready: Its warm-up report, once it sent one.
        windows: Its window reports, in order.
        final: Its closing report, once it sent one.
        failure: ``(status, error)`` once it failed; it is ended then.
    """

    def __init__(self, index: int, fork_server: ForkServerHandle, log_path: Path, preload: Sequence[str] = ()):
        self.index = index
        self.fork_server = fork_server
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.pid = fork_server.spawn(theirs.fileno(), log_fd, preload)
        finally:
            os.close(log_fd)
            theirs.close()
        self.conn = Connection(ours.detach())
        self.paused = False
        self.ended = False
        self.returncode: int | None = None
        self.ready: dict[str, Any] | None = None
        self.windows: list[dict[str, Any]] = []
        self.final: dict[str, Any] | None = None
        self.failure: tuple[str, str] | None = None

    def send(self, message: dict[str, Any]) -> None:
        self.conn.send_bytes(json.dumps({**message, "schema_version": SCHEMA_VERSION}).encode())

    def receive(self, timeout_s: float) -> tuple[dict[str, Any] | None, bool]:
        """The arm's next message, or (None, timed_out) when it died or stayed silent."""
        deadline = time.monotonic() + timeout_s
        while True:
            # Loader workers hold a copy of the control socket, so a dead arm need not
            # show as EOF at once: look at the process itself between short polls.
            left = deadline - time.monotonic()
            if left <= 0:
                return None, True
            try:
                if self.conn.poll(min(left, 0.25)):
                    message = json.loads(self.conn.recv_bytes())
                    if message.get("schema_version") != SCHEMA_VERSION:
                        return {"kind": "failed", "status": "error",
                                "error": f"arm message of schema version {message.get('schema_version')!r}"}, False
                    return message, False
            except (EOFError, OSError):
                return None, False
            if _is_gone(self.pid):
                return None, False

    def ask(self, message: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any] | None:
        """Send a command and wait for the answer; on any failure record it, end the arm, return None."""
        try:
            self.send(message)
        except OSError:
            pass  # a dead arm: its silence is classified below
        reply, timed_out = self.receive(timeout_s)
        returncode = None
        if reply is None:
            self.kill()
            returncode = self.returncode
        failure = classify_reply(reply, timed_out=timed_out, returncode=returncode, timeout_s=timeout_s, what=what)
        if failure:
            self.failure = failure
            self.kill()
            return None
        return reply

    def tree(self) -> list[int]:
        """The arm's pid and its loader workers' (empty once ended)."""
        if self.ended:
            return []
        import psutil

        try:
            proc = psutil.Process(self.pid)
            return [self.pid] + [p.pid for p in proc.children(recursive=True)]
        except psutil.Error:
            return []

    def pause(self) -> None:
        """Stop the arm's process group and wait (up to 2 s) until every member has stopped.

        SIGSTOP is delivered asynchronously; waiting keeps the next arm's window free of
        this arm's last few milliseconds of work.
        """
        if self.ended or self.paused:
            return
        try:
            os.killpg(self.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        self.paused = True
        import psutil

        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            states = []
            for pid in self.tree():
                try:
                    states.append(psutil.Process(pid).status())
                except psutil.Error:
                    continue
            if all(s in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) for s in states):
                return
            time.sleep(0.001)

    def resume(self) -> None:
        if not self.ended and self.paused:
            try:
                os.killpg(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.paused = False

    def kill(self) -> None:
        """End the arm and its loader workers and learn how it ended."""
        if self.ended:
            return
        self.ended = True
        _kill_group(self.pid)
        try:
            self.returncode = self.fork_server.wait(self.pid)
        except (OSError, RuntimeError, ValueError):
            self.returncode = None
        self.conn.close()
