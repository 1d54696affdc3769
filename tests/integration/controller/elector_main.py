"""A leader-election candidate in its own process, for the SIGKILL/SIGTERM tests.

    python -m tests.integration.controller.elector_main KUBECONFIG NAMESPACE LEASE IDENTITY

Prints ``LEADING`` when its work starts and ``OUTCOME <value>`` before it exits; SIGTERM asks
for a graceful stop (work first, then the Lease is released), as the operator's ``run`` does.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from kubernetes import config as k8s_config

from taskhandler_operator.controller.leader import ElectionConfig, LeaderElector

LEASE_DURATION = 8
RENEW_DEADLINE = 5.0
RETRY_PERIOD = 0.5


async def main(kubeconfig: str, namespace: str, lease: str, identity: str) -> int:
    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    config = ElectionConfig(
        namespace,
        lease,
        identity,
        lease_duration=LEASE_DURATION,
        renew_deadline=RENEW_DEADLINE,
        retry_period=RETRY_PERIOD,
    )
    elector = LeaderElector.on_client(api, config)  # as the operator wires it
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, elector.stop)

    async def work() -> None:
        print("LEADING", flush=True)
        await asyncio.Event().wait()

    outcome = await elector.run(work)
    print(f"OUTCOME {outcome.value}", flush=True)
    api.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:5])))
