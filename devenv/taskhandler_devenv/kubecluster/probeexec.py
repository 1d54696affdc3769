"""Runs one container probe (httpGet, tcpSocket, exec) the way the kubelet does; the answer is
(ok, message) with the kubelet's wording for failures. Scheduling lives in :mod:`.probes`."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import ssl
import subprocess
from collections.abc import Callable, Sequence

from .probes import ProbeSpec

Obj = dict[str, object]
ExecRunner = Callable[[Sequence[str], float], "tuple[int | None, str]"]
"""(command, timeout) → (exit code or None on timeout, output)."""

MAX_OUTPUT = 10 * 1024
#: What the kubelet sends as User-Agent on HTTP probes ("kube-probe/<major>.<minor>").
USER_AGENT = "kube-probe/1.37"


def resolve_port(port: object, container: Obj) -> int:
    """A number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    text = str(port)
    if text.isdigit():
        return int(text)
    for entry in container.get("ports") or []:  # type: ignore[attr-defined]
        if isinstance(entry, dict) and entry.get("name") == text:
            return int(entry["containerPort"])
    raise ValueError(f"port {text!r} not found in the container's ports")


def run_probe(
    spec: ProbeSpec, container: Obj, *, pod_ip: str, exec_runner: ExecRunner
) -> tuple[bool, str]:
    action = spec.action
    try:
        if spec.handler == "httpGet":
            return _http_get(action, container, pod_ip, spec.timeout)
        if spec.handler == "tcpSocket":
            host = str(action.get("host") or pod_ip)
            port = resolve_port(action.get("port"), container)
            try:
                with socket.create_connection((host, port), timeout=spec.timeout):
                    return True, ""
            except OSError as exc:
                return False, f"dial tcp {host}:{port}: {_reason(exc)}"
        if spec.handler == "exec":
            command = [str(a) for a in action.get("command") or []]
            if not command:
                return False, "exec probe has no command"
            code, output = exec_runner(command, spec.timeout)
            if code is None:
                return False, f"command {command!r} timed out"
            if code != 0:
                return False, output.strip()[-1024:] or f"command exited {code}"
            return True, ""
        return False, f"{spec.handler} probes are not supported by the process node"
    except ValueError as exc:
        return False, str(exc)


def _http_get(action: Obj, container: Obj, pod_ip: str, timeout: float) -> tuple[bool, str]:
    host = str(action.get("host") or pod_ip)
    port = resolve_port(action.get("port"), container)
    path = str(action.get("path") or "/")
    scheme = str(action.get("scheme") or "HTTP").upper()
    url = f"{scheme.lower()}://{host}:{port}{path}"
    connection: http.client.HTTPConnection
    if scheme == "HTTPS":
        # The kubelet does not verify a probe's certificate either.
        context = ssl._create_unverified_context()
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {"User-Agent": USER_AGENT, "Accept": "*/*"}
    for header in action.get("httpHeaders") or []:  # type: ignore[attr-defined]
        headers[str(header["name"])] = str(header["value"])
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        response.read(MAX_OUTPUT)
        status = response.status
    except TimeoutError:
        return False, f'Get "{url}": context deadline exceeded (Client.Timeout exceeded)'
    except OSError as exc:
        return False, f'Get "{url}": dial tcp {host}:{port}: {_reason(exc)}'
    except http.client.HTTPException as exc:
        return False, f'Get "{url}": {type(exc).__name__}: {exc}'
    finally:
        connection.close()
    if 200 <= status < 400:
        return True, ""
    return False, f"HTTP probe failed with statuscode: {status}"


def _reason(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connect: connection refused"
    if isinstance(exc, TimeoutError):
        return "i/o timeout"
    return exc.strerror or str(exc)


def run_command(
    argv: Sequence[str], timeout: float, pass_fds: Sequence[int] = ()
) -> tuple[int | None, str]:
    """Run ``argv`` (a launcher call) in its own process group and collect its output; None as
    the code on timeout (the whole group is killed then)."""
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
        env={},
    )
    try:
        output, _ = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.communicate()
        return None, ""
    return popen.returncode, output[-MAX_OUTPUT:].decode("utf-8", "replace")
