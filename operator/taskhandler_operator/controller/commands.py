"""``taskhandler-operator run``: the operator process.

Logs in with the kubeconfig (``--kubeconfig``, ``$KUBECONFIG``) or the pod's service account,
opens the database, starts the health/metrics endpoints and the artifact server, waits for the
leader Lease (:mod:`.leader`), and only then runs kopf in the same event loop. SIGTERM stops
kopf, releases the Lease (a standby takes over at once) and exits 0; losing the Lease exits 1
at once, because the process must never reconcile without it.

Exit codes: 0 stopped, 1 leadership lost or the operator failed, 2 bad settings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskhandler_operator.settings import Settings, SettingsError, add_arguments, load_settings

if TYPE_CHECKING:
    from taskhandler_operator.kube.probe_job import ProbePodSettings

#: The default shard's Lease (unchanged from before shards); a shard's is ``<this>-<shard>``.
LEASE_NAME = "taskhandler-operator"
EXIT_FAILED = 1
EXIT_USAGE = 2
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

log = logging.getLogger("taskhandler_operator.run")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the operator (reconcile TaskHandlerBundles into Airflow's database)",
        description=(
            "Run the operator: watch TaskHandlerBundles (all namespaces, or --namespace ones), "
            "probe their artifacts with Jobs and publish bindings into Airflow's database. "
            "Only the replica holding the leader Lease reconciles."
        ),
    )
    add_arguments(parser)
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: $KUBECONFIG; in a pod: its service account)",
    )
    parser.add_argument(
        "--operator-image",
        default=os.environ.get("THOP_OPERATOR_IMAGE", "taskhandler-operator"),
        help="image of the probe Jobs' fetch container (and of Go probes) "
        "(default: $THOP_OPERATOR_IMAGE or taskhandler-operator)",
    )
    parser.add_argument(
        "--lease-namespace",
        default=os.environ.get("THOP_LEASE_NAMESPACE") or os.environ.get("POD_NAMESPACE"),
        help="namespace of the leader Lease (default: $THOP_LEASE_NAMESPACE, $POD_NAMESPACE, "
        "or the pod's own namespace)",
    )
    parser.add_argument(
        "--lease-name",
        default=os.environ.get("THOP_LEASE_NAME") or None,
        help=f"name of the leader Lease (default: $THOP_LEASE_NAME, else {LEASE_NAME} for the "
        f"default shard and {LEASE_NAME}-<shard> for a shard)",
    )
    parser.add_argument(
        "--health-host",
        default=os.environ.get("THOP_HEALTH_HOST", "0.0.0.0"),  # noqa: S104
        help="address of the health and metrics endpoints (default: all interfaces)",
    )
    parser.add_argument(
        "--probe-service-account",
        default=os.environ.get("THOP_PROBE_SERVICE_ACCOUNT", "taskhandler-probe"),
        help="service account of probe pods, in each bundle's namespace",
    )
    parser.set_defaults(func=run)


def default_lease_name(shard: str) -> str:
    """The leader Lease of shard ``shard`` ("" is the default shard): each shard elects its own
    leader, and the database fence is keyed by the Lease, so each has its own term too."""
    return f"{LEASE_NAME}-{shard}" if shard else LEASE_NAME


def run(args: argparse.Namespace) -> int:
    from taskhandler_operator.controller.logs import LogFormat, Redactor, configure

    try:
        settings = load_settings(args)
        settings.resolved_database_url()
        settings.resolved_signing_key()
    except SettingsError as exc:
        print(f"taskhandler-operator run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not args.lease_name:
        args.lease_name = default_lease_name(settings.shard)
    lease_namespace = args.lease_namespace
    if not lease_namespace and SA_NAMESPACE.is_file():
        lease_namespace = SA_NAMESPACE.read_text().strip()
    if not lease_namespace:
        print(
            "taskhandler-operator run: no namespace for the leader Lease: pass --lease-namespace "
            "(or set THOP_LEASE_NAMESPACE / POD_NAMESPACE)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    redactor = Redactor()
    url = settings.resolved_database_url()
    if url:
        redactor.add(url)
    fmt = LogFormat.JSON if settings.log_format == "json" else LogFormat.PLAIN
    configure(fmt, level=settings.log_level.upper(), redactor=redactor)
    try:
        return asyncio.run(_main(settings, args, lease_namespace, redactor))
    except _StartupError as exc:
        print(f"taskhandler-operator run: {exc}", file=sys.stderr)
        return EXIT_USAGE


class _StartupError(Exception):
    pass


async def _record_term(runtime: Any, elector: Any, lease_namespace: str, lease_name: str) -> bool:
    """Begin the leader fence's term (db/fence.py) and try to record it at once, so a deposed
    predecessor's writes are refused from now on. A database that is down only delays it: the
    first write records it. False when a newer term is recorded (this replica steps down)."""
    from taskhandler_operator.db.engine import DatabaseError
    from taskhandler_operator.db.fence import FencedOut

    term = elector.term
    if term is None:  # the Lease was lost before the work started
        return False
    fence = runtime.fence
    fence.on_deposed = elector.step_down
    fence.begin(
        lease_namespace=lease_namespace,
        lease_name=lease_name,
        lease_uid=term.lease_uid,
        holder=term.holder,
        transitions=term.transitions,
    )
    try:
        await fence.record(runtime.engine)
    except FencedOut:
        return False
    except DatabaseError as exc:
        log.warning("cannot record the leadership term yet (%s); the first write will", exc)
    return True


def _api_client(kubeconfig: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
    except config.ConfigException as exc:
        raise _StartupError(
            f"no kubeconfig given and not running in a pod ({exc}); pass --kubeconfig"
        ) from None
    return client.ApiClient()


async def _cluster_id(given: str | None, api_client: Any) -> str:
    from taskhandler_operator.controller.kubeapi import KubeApi, KubeApiError

    if given:
        return given
    api = KubeApi(api_client, max_workers=1)
    try:
        ns = await api.request_json(
            "read Namespace kube-system", "GET", "/api/v1/namespaces/kube-system"
        )
    except KubeApiError as exc:
        raise _StartupError(
            f"cannot tell this cluster's id ({exc}); set THOP_CLUSTER_ID (--cluster-id)"
        ) from None
    finally:
        await api.aclose()
    return str(ns["metadata"]["uid"])


def probe_pod_settings(settings: Settings, service_account: str) -> ProbePodSettings:
    """The probe pods' settings from the operator's: what the chart's probe values reach."""
    from taskhandler_operator.kube.probe_job import ProbePodSettings

    return ProbePodSettings(
        service_account=service_account, image_pull_policy=settings.probe_image_pull_policy
    )


async def _main(
    settings: Any, args: argparse.Namespace, lease_namespace: str, redactor: Any
) -> int:
    import kopf
    from kopf._core.engines.peering import Identity  # not re-exported by kopf

    from taskhandler_operator.controller.health import HealthState, Heartbeat
    from taskhandler_operator.controller.leader import ElectionConfig, LeaderElector, Outcome
    from taskhandler_operator.controller.metrics import Metrics
    from taskhandler_operator.controller.runtime import OperatorRuntime, RuntimeOptions
    from taskhandler_operator.controller.shardsync import run_resync
    from taskhandler_operator.controller.switchboard import (
        SwitchboardConfig,
        build_registry,
        bundle_selector,
        configure,
    )

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's login reads it
    api_client = _api_client(args.kubeconfig)
    cluster_id = await _cluster_id(settings.cluster_id, api_client)
    options = RuntimeOptions(
        cluster_id=cluster_id,
        operator_image=args.operator_image,
        health_host=args.health_host,
        pod_settings=probe_pod_settings(settings, args.probe_service_account),
    )
    metrics = Metrics(shard=settings.shard_name)
    health = HealthState()
    election = ElectionConfig(namespace=lease_namespace, name=args.lease_name)
    elector_beat = health.add(Heartbeat("leader-election", settings.liveness_election_seconds))
    elector = LeaderElector.on_client(
        api_client, election, on_tick=elector_beat.beat, on_leading=metrics.set_leader
    )
    health.leading = lambda: elector.is_leader
    stop = asyncio.Event()
    lost = False

    def request_stop(signum: int) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        stop.set()
        elector.stop()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, request_stop, signum)

    async with OperatorRuntime.open(
        settings, options, api_client, redactor=redactor, health=health, metrics=metrics
    ) as runtime:
        health.started = True
        log.info(
            "operator started (cluster %s, shard %s: bundles %s); waiting for the Lease %s/%s",
            cluster_id,
            settings.shard_name,
            bundle_selector(settings.shard),
            lease_namespace,
            args.lease_name,
        )

        async def work() -> None:
            if not await _record_term(runtime, elector, lease_namespace, args.lease_name):
                return  # a newer leader is recorded: the elector steps down
            kopf_settings = kopf.OperatorSettings()
            configure(kopf_settings, settings.shard)
            registry = build_registry(SwitchboardConfig(runtime, kubeconfig=args.kubeconfig))
            runtime.reconciler_heartbeat.arm()
            namespaces = list(settings.namespaces)
            # The leader's only: a standby holds nothing.
            resync = (
                asyncio.create_task(
                    run_resync(
                        runtime.kube,
                        runtime.holds,
                        settings.shard,
                        settings.namespaces,
                        settings.shard_name,
                        settings.shard_resync_seconds,
                    ),
                    name="shard-resync",
                )
                if settings.shard_resync_seconds > 0
                else None
            )
            try:
                await kopf.operator(
                    registry=registry,
                    settings=kopf_settings,
                    clusterwide=not namespaces,
                    namespaces=namespaces,
                    standalone=True,
                    stop_flag=stop,
                    # kopf's default identity calls getpass.getuser(), which fails for a
                    # runAsUser without a passwd entry (any numeric uid in a restricted pod);
                    # reuse the Lease's.
                    identity=Identity(elector.identity),
                )
            finally:
                if resync is not None:
                    resync.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await resync
            # kopf installs its own SIGTERM/SIGINT handlers in the main thread (replacing
            # request_stop), so a signal ends kopf without setting ``stop``. A lost Lease
            # cancels this task instead of letting kopf return, so a normal return is always a
            # requested stop: without this the release after SIGTERM was reported as a lost
            # Lease and the process exited 1.
            if not stop.is_set():
                log.info("kopf stopped on a signal: stopping")
                stop.set()

        async def stopped() -> None:
            nonlocal lost
            if not stop.is_set():
                lost = True
                log.error("leadership lost: exiting so no two replicas reconcile")

        outcome = await elector.run(work, on_stopped=stopped)
        log.info("operator stopped (%s)", outcome.value)
    api_client.close()
    return EXIT_FAILED if lost or outcome is Outcome.LOST else 0
