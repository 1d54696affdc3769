"""One probe run: the runtime process, its two channels, and every bounded wait.

The driver (``driver.py``) verifies the artifact and turns the outcome into a summary; this
module does the rest of reference ``airflow-langsdk.md`` §5 and §6.3: loopback listeners,
the ownership check of each connection, the id-0 request, answering ``Get*`` requests with an
``ErrorResponse``, one acknowledged result, the exit grace and the cleanup of every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass

from taskhandler_operator.artifacts.models import Language, VerifiedArtifact
from taskhandler_operator.protocol.eventlog import EventLog
from taskhandler_operator.protocol.frames import (
    FrameTooLarge,
    FrameTruncated,
    MalformedFrame,
    ResponseFrame,
    decode_request,
    encode_response,
    read_frame,
)
from taskhandler_operator.protocol.launch import (
    ProbeConfig,
    UnsafeCommand,
    build_command,
    runtime_environment,
)
from taskhandler_operator.protocol.plain import (
    InvalidMessage,
    LogStats,
    PlainResult,
    ProbeErrorKind,
    RuntimeRequestType,
    error_response,
    parse_request_body,
    read_runtime_message,
)
from taskhandler_operator.protocol.process_tree import (
    ChildSubreaper,
    ProcessTracker,
    find_connection_owner,
    reap_orphans,
)
from taskhandler_operator.protocol.relay import RelayBudget, relay_stream

__all__ = ["ProbeFailure", "ProbeSession", "ProbeWarning", "ms_since"]

LOOPBACK = "127.0.0.1"
# How long an accepted connection may take to show up in the runtime's process tree
# (reference §5: 1.0 s, polled every 50 ms).
OWNERSHIP_WAIT = 1.0
OWNERSHIP_POLL = 0.05
# After the runtime exits, how long its comm channel may take to deliver what is still
# buffered (a frame written just before exit) and reach end of stream.
COMM_DRAIN = 0.5
# A write to the runtime that cannot complete in this time means it stopped reading.
WRITE_TIMEOUT = 5.0
# While waiting for the answer and the exit, how often the process tree is re-recorded,
# so that a child which later escapes the session is still known.
SNAPSHOT_INTERVAL = 0.25
RELAY_DRAIN = 0.5
REAP_TIMEOUT = 5.0

NO_CLIENT_DETAIL = "a task handler probe has no Airflow client; {kind} cannot be answered"
DUPLICATE_RESULT_DETAIL = "A parse result was already received"


@dataclass(frozen=True, slots=True)
class ProbeWarning:
    """Something wrong that does not cost the answer (see docs/protocol.md, "Decisions")."""

    kind: str
    message: str


class ProbeFailure(Exception):
    def __init__(self, kind: ProbeErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def ms_since(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 2)


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _Listener:
    """A loopback listener whose accepted connections wait in a queue for the ownership check."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.queue: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connect, LOOPBACK, 0)

    def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.queue.put_nowait((reader, writer))

    @property
    def address(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    def stop_listening(self) -> None:
        """Accept nothing more; connections already accepted stay open."""
        if self._server is not None:
            self._server.close()
        while not self.queue.empty():
            _, writer = self.queue.get_nowait()
            writer.close()


class ProbeSession:
    """One runtime process and its two channels."""

    def __init__(
        self,
        config: ProbeConfig,
        verified: VerifiedArtifact,
        log: EventLog,
        timings: dict[str, float],
    ) -> None:
        self.config = config
        self.verified = verified
        self.log = log
        self.timings = timings
        self.budget = RelayBudget(config.relay_limits)
        self.process: asyncio.subprocess.Process | None = None
        self.tracker: ProcessTracker | None = None
        self.result: PlainResult | None = None
        self.result_received = asyncio.Event()
        self.warnings: list[ProbeWarning] = []
        self._subreaper = ChildSubreaper()
        self._baseline: frozenset[tuple[int, float]] = frozenset()
        self._comm_writer: asyncio.StreamWriter | None = None
        self._logs_writer: asyncio.StreamWriter | None = None
        self._ended: set[asyncio.StreamWriter] = set()
        self._requested_at = 0.0
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: list[asyncio.Task[object]] = []
        self._relays: list[asyncio.Task[None]] = []
        self._pipes: list[asyncio.BaseTransport] = []
        self._comm_task: asyncio.Task[None] | None = None
        self._exit_task: asyncio.Task[int] | None = None
        self._listeners = (_Listener("comm"), _Listener("logs"))

    # -- reporting ------------------------------------------------------------------------

    @property
    def exit_code(self) -> int | None:
        return self.process.returncode if self.process else None

    @property
    def pids(self) -> list[int]:
        return self.tracker.seen_pids if self.tracker else []

    def log_stats(self) -> LogStats:
        return LogStats(
            relayed_lines=self.budget.relayed_lines,
            dropped_lines=self.budget.dropped_lines,
            truncated_lines=self.budget.truncated_lines,
        )

    # -- the probe --------------------------------------------------------------------------

    async def run(self) -> PlainResult:
        try:
            result = await self._run()
        except ProbeFailure:
            raise
        except Exception as exc:  # a driver bug must still end in a summary and a cleanup
            raise ProbeFailure(
                ProbeErrorKind.DRIVER_ERROR, f"probe driver error: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            cleanup_started = time.monotonic()
            unkillable = await self._cleanup()
            self.timings["cleanup_ms"] = ms_since(cleanup_started)
        if unkillable:
            # The answer may be fine, but the pod would go on running code nobody can stop.
            raise ProbeFailure(
                ProbeErrorKind.PROCESSES_LEFT,
                f"{len(unkillable)} process(es) of the runtime could not be killed "
                f"(pids {_pid_list(unkillable)})",
            )
        return result

    async def _run(self) -> PlainResult:
        comm, logs = self._listeners
        await comm.start()
        await logs.start()
        await self._spawn(comm.address, logs.address)
        comm_reader, comm_writer = await self._connect()
        dag_ids = list(self.config.dag_ids) if self.config.dag_ids is not None else None
        self.log.info("sending parse request", dag_ids=dag_ids)
        request = parse_request_body(
            file=str(self.config.artifact.absolute()),
            bundle_path=str(self.config.effective_bundle_root),
            bundle_name=self.config.effective_bundle_name,
            dag_ids=dag_ids,
        )
        requested = self._requested_at = time.monotonic()
        await self._send(comm_writer, ResponseFrame(0, request))
        self._comm_task = asyncio.create_task(self._serve_comm(comm_reader, comm_writer))
        self._tasks.append(asyncio.create_task(self._snapshot_periodically()))
        await self._await_result(requested)
        acknowledged = time.monotonic()
        await self._await_exit()
        self.timings["exit_ms"] = ms_since(acknowledged)
        assert self.result is not None
        return self.result

    async def _spawn(self, comm_address: str, logs_address: str) -> None:
        try:
            argv = build_command(
                self.verified,
                java=self._executable(self.config.java, Language.JAVA),
                node=self._executable(self.config.node, Language.TYPESCRIPT),
                jvm_args=self.config.jvm_args,
            )
        except UnsafeCommand as exc:
            raise ProbeFailure(ProbeErrorKind.ARTIFACT_REFUSED, str(exc)) from None
        argv += [f"--comm={comm_address}", f"--logs={logs_address}"]
        # stdout/stderr are our own pipes, not asyncio's: asyncio's Process.wait() only returns
        # once its pipes close, and a descendant that inherited them would hide the exit.
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        # Adopt every orphan of the runtime's tree from now on, so that a grandchild which
        # double-forks out of the session is still ours to find and kill.
        self._subreaper.__enter__()
        self._baseline = await asyncio.to_thread(ProcessTracker.baseline_of, os.getpid())
        spawning = time.monotonic()
        try:
            self.process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_write,
                stderr=err_write,
                start_new_session=True,
                env=runtime_environment(os.environ),
            )
        except OSError as exc:
            for fd in (out_read, err_read):
                os.close(fd)
            raise ProbeFailure(
                ProbeErrorKind.LAUNCH_FAILED, f"cannot start the runtime {argv[0]!r}: {exc}"
            ) from exc
        finally:
            os.close(out_write)
            os.close(err_write)
        self.timings["spawn_ms"] = ms_since(spawning)
        self._exit_task = asyncio.create_task(self.process.wait())
        for source, fd in (("stdout", out_read), ("stderr", err_read)):
            reader = await self._pipe_reader(fd)
            self._relays.append(
                asyncio.create_task(relay_stream(reader, source, self.log, self.budget))
            )
        self.tracker = await asyncio.to_thread(self._new_tracker, self.process.pid)
        self.log.info("runtime started", pid=self.process.pid, argv=argv)

    def _new_tracker(self, pid: int) -> ProcessTracker:
        if not self._subreaper.active:
            return ProcessTracker(pid)
        return ProcessTracker(pid, adopter=os.getpid(), baseline=self._baseline)

    async def _pipe_reader(self, fd: int) -> asyncio.StreamReader:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        pipe = os.fdopen(fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe
        )
        self._pipes.append(transport)
        return reader

    def _executable(self, name: str, language: Language) -> str:
        if self.verified.language is not language:
            return name
        found = shutil.which(name)
        if found is None:
            raise ProbeFailure(
                ProbeErrorKind.LAUNCH_FAILED,
                f"the {language.value} runtime needs {name!r}, which is not an executable "
                "file on PATH",
            )
        return found

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert self._exit_task is not None
        started = time.monotonic()
        accepts = {
            listener.channel: asyncio.create_task(self._accept_owned(listener))
            for listener in self._listeners
        }
        self._tasks.extend(accepts.values())
        deadline = started + self.config.connect_timeout
        while True:
            waiting = [name for name, task in accepts.items() if not task.done()]
            if not waiting:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProbeFailure(
                    ProbeErrorKind.CONNECT_TIMEOUT,
                    f"The runtime did not connect its {' and '.join(waiting)} channel"
                    f"{'s' if len(waiting) > 1 else ''} within {self.config.connect_timeout:g}s",
                )
            await asyncio.wait(
                [*(accepts[name] for name in waiting), self._exit_task],
                timeout=remaining,
                return_when=asyncio.FIRST_COMPLETED,
            )
            waiting = [name for name, task in accepts.items() if not task.done()]
            if self._exit_task.done() and waiting:
                raise ProbeFailure(
                    ProbeErrorKind.EXITED_BEFORE_CONNECT,
                    f"The runtime {_describe_exit(self._exit_task.result())} before "
                    f"connecting its {' and '.join(waiting)} channel"
                    f"{'s' if len(waiting) > 1 else ''}",
                )
        for listener in self._listeners:
            listener.stop_listening()
        self.timings["connect_ms"] = ms_since(started)
        comm_reader, comm_writer = accepts["comm"].result()
        logs_reader, logs_writer = accepts["logs"].result()
        self._comm_writer, self._logs_writer = comm_writer, logs_writer
        self._relays.append(asyncio.create_task(self._relay_logs(logs_reader, logs_writer)))
        return comm_reader, comm_writer

    async def _relay_logs(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await relay_stream(reader, "logs", self.log, self.budget)
        # The runtime ended its logs channel: close ours, or a runtime that waits for its
        # supervisor to close (as Airflow's SDK runtimes do) would never exit.
        writer.close()

    def _end(self, writer: asyncio.StreamWriter | None) -> None:
        """End our side of a channel (the runtime reads end of stream); reading goes on."""
        if writer is None or writer in self._ended or writer.is_closing():
            return
        self._ended.add(writer)
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()

    async def _accept_owned(
        self, listener: _Listener
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert self.process is not None
        while True:
            reader, writer = await listener.queue.get()
            self._writers.append(writer)
            peer = writer.get_extra_info("peername")
            local = writer.get_extra_info("sockname")
            owner = await self._owner_of(peer[:2], local[:2])
            if owner is not None:
                self.log.info("channel connected", channel=listener.channel, owner_pid=owner)
                return reader, writer
            self.log.warning(
                "refused a connection from outside the runtime's process tree",
                channel=listener.channel,
                peer=f"{peer[0]}:{peer[1]}",
            )
            writer.close()

    async def _owner_of(self, peer: tuple[str, int], local: tuple[str, int]) -> int | None:
        assert self.process is not None
        deadline = time.monotonic() + OWNERSHIP_WAIT
        while True:
            owner = await asyncio.to_thread(find_connection_owner, self.process.pid, peer, local)
            if owner is not None or time.monotonic() >= deadline:
                return owner
            await asyncio.sleep(OWNERSHIP_POLL)

    async def _send(self, writer: asyncio.StreamWriter, frame: ResponseFrame) -> None:
        if writer in self._ended or writer.is_closing():
            # Our side is already ended (after the acknowledgement): nothing more can be said.
            self.log.debug("not answering on an ended comm channel", request_id=frame.id)
            return
        writer.write(encode_response(frame))
        try:
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
        except TimeoutError as exc:
            raise ProbeFailure(
                ProbeErrorKind.ANSWER_TIMEOUT,
                f"The runtime stopped reading its comm channel for {WRITE_TIMEOUT:g}s",
            ) from exc
        except ConnectionError:
            # The runtime closed the channel; what it did matters more and is reported by
            # the reader side or by its exit.
            self.log.debug("runtime closed the comm channel before a frame was delivered")

    async def _serve_comm(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read runtime frames until end of stream; raise ProbeFailure on a protocol violation."""
        while True:
            try:
                payload = await read_frame(reader, self.config.max_frame_size)
            except FrameTooLarge as exc:
                raise ProbeFailure(
                    ProbeErrorKind.FRAME_TOO_LARGE,
                    f"The runtime sent a frame of {exc.length} bytes, over the limit of "
                    f"{exc.limit} bytes",
                ) from exc
            except FrameTruncated as exc:
                raise ProbeFailure(
                    ProbeErrorKind.INVALID_FRAME,
                    f"The runtime's comm channel ended inside a frame: {exc}",
                ) from exc
            except ConnectionError:
                payload = None
            if payload is None:
                # The runtime ended the channel: close ours at once (see _relay_logs).
                writer.close()
                return
            await self._handle(payload, writer)

    async def _handle(self, payload: bytes, writer: asyncio.StreamWriter) -> None:
        try:
            frame = decode_request(payload)
        except MalformedFrame as exc:
            raise ProbeFailure(
                ProbeErrorKind.INVALID_FRAME, f"The runtime sent an invalid frame: {exc}"
            ) from exc
        try:
            message = _read_message(frame.body)
        except InvalidMessage as exc:
            raise ProbeFailure(
                ProbeErrorKind.INVALID_MESSAGE,
                f"The runtime sent a message that does not validate: {exc}",
            ) from exc
        if isinstance(message, RuntimeRequestType):
            self.log.info("answered a runtime request with an error", request=message.type)
            detail = {"message": NO_CLIENT_DETAIL.format(kind=message.type)}
            await self._send(writer, ResponseFrame(frame.id, error=_error(detail)))
            return
        if self.result is not None:
            await self._send(
                writer,
                ResponseFrame(frame.id, error=_error({"message": DUPLICATE_RESULT_DETAIL})),
            )
            raise ProbeFailure(
                ProbeErrorKind.DUPLICATE_RESULT,
                f"The runtime sent a second parse result (request id {frame.id}); "
                "a probe takes exactly one",
            )
        self.result = message
        self.timings["answer_ms"] = ms_since(self._requested_at)
        self.log.info(
            "parse result received",
            request_id=frame.id,
            dags=len(message.task_handlers),
            handlers=message.handler_count,
        )
        # Record the tree before the acknowledgement lets the runtime exit: a child started
        # before the answer is known even if it leaves the session afterwards.
        assert self.tracker is not None
        await asyncio.to_thread(self.tracker.snapshot)
        await self._send(writer, ResponseFrame(frame.id))
        # The exchange is over: end our side of both channels, so that a runtime waiting for
        # its supervisor to hang up can exit now. We keep reading until it ends its side.
        self._end(writer)
        self._end(self._logs_writer)
        self.result_received.set()

    async def _await_result(self, requested: float) -> None:
        assert self._comm_task is not None and self._exit_task is not None
        timeout = self.config.answer_timeout
        result_wait = asyncio.create_task(self.result_received.wait())
        self._tasks.append(result_wait)
        await self._until_any([result_wait, self._comm_task, self._exit_task], requested + timeout)
        if self.result is not None:
            return
        if self._exit_task.done():
            # Frames written just before the exit may still be buffered in the channel.
            await self._until_any([result_wait, self._comm_task], time.monotonic() + COMM_DRAIN)
            if self.result is not None:
                return
            raise ProbeFailure(
                ProbeErrorKind.EXITED_WITHOUT_RESULT,
                f"The runtime {_describe_exit(self._exit_task.result())} without a parse result",
            )
        if self._comm_task.done():
            exited = await self._until_any(
                [self._exit_task], time.monotonic() + self.config.exit_grace
            )
            if exited:
                raise ProbeFailure(
                    ProbeErrorKind.EXITED_WITHOUT_RESULT,
                    f"The runtime {_describe_exit(self._exit_task.result())} without a parse "
                    "result",
                )
            raise ProbeFailure(
                ProbeErrorKind.EXITED_WITHOUT_RESULT,
                "The runtime closed its comm channel without a parse result",
            )
        note = ""
        if self.budget.dropped_lines:
            note = f" (it flooded its output: {self.budget.dropped_lines} lines dropped)"
        raise ProbeFailure(
            ProbeErrorKind.ANSWER_TIMEOUT,
            f"The runtime did not send a parse result within {timeout:g}s{note}",
        )

    async def _await_exit(self) -> None:
        assert self._comm_task is not None and self._exit_task is not None
        grace = self.config.exit_grace
        exited = await self._until_any([self._exit_task], time.monotonic() + grace)
        if not exited:
            # The answer is complete, valid and acknowledged; the runtime only failed to leave.
            # Keep the answer, say so, and let the cleanup kill the whole tree.
            self.warnings.append(
                ProbeWarning(
                    ProbeErrorKind.EXIT_TIMEOUT.value,
                    f"The runtime did not exit within {grace:g}s after its parse result was "
                    "acknowledged; it was killed",
                )
            )
            self.log.warning("runtime overstayed its exit grace", exit_grace_s=grace)
            return
        # Let the channel reach end of stream, so a frame sent just before exit is handled.
        await self._until_any([self._comm_task], time.monotonic() + COMM_DRAIN)
        code = self._exit_task.result()
        if code != 0:
            raise ProbeFailure(
                ProbeErrorKind.EXIT_STATUS,
                f"The runtime {_describe_exit(code)} after sending its parse result",
            )
        assert self.tracker is not None
        left = await asyncio.to_thread(self.tracker.survivors)
        if left:
            raise ProbeFailure(
                ProbeErrorKind.PROCESSES_LEFT,
                f"The runtime exited but left {len(left)} process(es) running "
                f"(pids {_pid_list(left)})",
            )

    async def _until_any(self, targets: Sequence[asyncio.Task[object]], deadline: float) -> bool:
        """Wait until one target is done or the deadline passes; a comm failure raises at once.

        Returns whether a target finished.
        """
        assert self._comm_task is not None
        while True:
            self._raise_comm_failure()
            if any(task.done() for task in targets):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await asyncio.wait(
                {*targets, self._comm_task},
                timeout=remaining,
                return_when=asyncio.FIRST_COMPLETED,
            )

    def _raise_comm_failure(self) -> None:
        task = self._comm_task
        if task is None or not task.done() or task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            raise exc

    async def _snapshot_periodically(self) -> None:
        assert self.tracker is not None
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL)
            await asyncio.to_thread(self.tracker.snapshot)

    async def _cleanup(self) -> list[int]:
        """Kill and reap everything; returns the pids that could not be killed."""
        for listener in self._listeners:
            listener.stop_listening()
        tasks: list[asyncio.Task[object]] = [*self._tasks]
        if self._comm_task is not None:
            tasks.append(self._comm_task)
        for task in tasks:
            task.cancel()
        if self.tracker is None and self.process is not None:
            self.tracker = await asyncio.to_thread(self._new_tracker, self.process.pid)
        unkillable: list[int] = []
        if self.tracker is not None:
            report = await asyncio.to_thread(self.tracker.kill_all)
            survivors = [pid for pid in report.signalled if pid != self.tracker.root_pid]
            if survivors:
                self.log.warning("killed leftover runtime processes", pids=survivors)
            unkillable = report.unkillable
            if unkillable:
                self.log.error("runtime processes survived SIGKILL", pids=unkillable)
        if self.process is not None and self._exit_task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exit_task), REAP_TIMEOUT)
            if self.process.returncode is not None:
                self.log.info("runtime exited", exit_code=self.process.returncode)
        for writer in self._writers:
            writer.close()
        if self._relays:
            _, pending = await asyncio.wait(self._relays, timeout=RELAY_DRAIN)
            for task in pending:
                task.cancel()
        await asyncio.gather(*tasks, *self._relays, return_exceptions=True)
        for transport in self._pipes:
            transport.close()
        self._subreaper.__exit__()
        if os.getpid() == 1:
            reap_orphans()
        return unkillable


def _read_message(body: object) -> PlainResult | RuntimeRequestType:
    """A runtime's message: plainly (plain.py) when it can be, else by the pydantic models,
    imported only then, which coerce or name what is wrong exactly as the operator's side."""
    message = read_runtime_message(body)
    if message is not None:
        return message
    from taskhandler_operator.protocol import messages

    model = messages.parse_runtime_message(body)  # raises InvalidMessage
    assert isinstance(model, messages.TaskHandlerParsingResult)
    return PlainResult(model.model_dump(mode="json"))


def _pid_list(pids: Sequence[int]) -> str:
    return ", ".join(str(pid) for pid in pids[:8])


def _error(detail: dict[str, str]) -> dict[str, object]:
    return error_response(detail)
