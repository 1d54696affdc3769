"""Development environment helpers: not used by the operator, never imported by it.

What ``make demo``, the tests and the benchmarks share, in one place, so the demo needs nothing
from ``tests/``. They expect a source checkout (the Airflow side venv script in ``hack/``, the
runtime sources in ``tests/fixtures/runtimes/``) and the toolchains ``make system-deps``
installs:

* :mod:`.postgres`: a throwaway PostgreSQL server and the pinned Airflow's CLI in its side venv
  (``airflow db migrate``, ``airflow dags reserialize``);
* :mod:`.runtimes`: the Go, Java and TypeScript test runtimes, built with the real toolchains
  and cached under ``$THOP_CACHE/runtimes``;
* :mod:`.packers`: the three artifact formats packed from parts;
* :mod:`.serialized_dags`: serialized Dag documents with stub tasks, and the Airflow rows that
  hold them;
* :mod:`.chart_install`: the chart's values for a release on the test control plane's process
  node (free host ports, loopback artifact URL, the image the node runs from the venv);
* :mod:`.git_server`: a git (and file) server over HTTP on loopback (:mod:`.http_server` run
  as its own process) and repositories to commit to;
* :mod:`.s3_server`: VersityGW as a local S3 server on loopback, with an access log;
* :mod:`.manifests`: TaskHandlerBundle manifests (one builder for every source kind);
* :mod:`.operator_process`: ``taskhandler-operator run`` as a host process against the test
  control plane (the namespace and RBAC it needs, replicas, reconcile requests, bounded polls),
  shared by the operator e2e and chaos tests and the operator benchmark;
* :mod:`.scratch`: where throwaway servers keep their data (tmpfs when roomy).
* :mod:`.orders_cluster`: the example as the manifests of ``hack/kind/examples/`` (shared by
  ``make kind-examples`` and ``make demo``), the Dag's seeding and the bundles' push;
* :mod:`.guardian`: a watchdog process that cleans up after the demo if it dies uncleanly;
* :mod:`.console`: printing that survives a broken stdout (``make demo | tee`` and Ctrl-C).

The pytest plugins in ``tests/fixtures/`` turn these into fixtures.
"""
