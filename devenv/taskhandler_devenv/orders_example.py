"""The example ``make demo`` runs: one mixed-language Dag and three artifact bundles.

``orders_etl`` extracts in Go, transforms in Java and publishes in TypeScript, plus one ordinary
Python task. Airflow 3.3.2 has no ``@task.stub``, so the Dag's stub tasks are ordinary ``@task``
functions on the stub queues, and :data:`STUB_ARGUMENTS` are the stub fields newer Airflow
serializes (added to Airflow's own rows with ``serialized_dags.add_stub_fields``). Each bundle's
handlers are compiled into its test runtime (:mod:`.runtimes`). See ``docs/demo.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection

from taskhandler_devenv.serialized_dags import literal_arg, register_dag_bundle, xcom_arg
from taskhandler_operator.artifacts.models import Language

DAG_ID: Final = "orders_etl"
DAG_FILE: Final = "orders_etl.py"

# A mixed-language Dag as a Dag author would write it. Airflow 3.3.2 has no @task.stub, so the
# tasks are ordinary @task functions on the stub queues; step 3 adds the stub fields newer
# Airflow serializes to the rows Airflow itself wrote. `notify` stays an ordinary Python task.
DAG_SOURCE: Final = '''\
"""Orders ETL: extract in Go, transform in Java, publish in TypeScript."""

import pendulum
from airflow.sdk import dag, task


@dag(dag_id="orders_etl", start_date=pendulum.datetime(2026, 1, 1), schedule=None, catchup=False)
def orders_etl():
    @task(queue="go")
    def extract(source, since=None):
        ...

    @task(queue="java")
    def transform(rows, currency, threshold=100):
        ...

    @task(queue="typescript")
    def publish(summary, channel):
        ...

    @task
    def notify():
        ...

    rows = extract("s3://orders/raw/2026-01-01")
    summary = transform(rows, currency="EUR")
    publish(summary, channel="#orders") >> notify()


orders_etl()
'''

NULLABLE_TIMESTAMP: Final = {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]}

# `_arg_bindings` of each stub, in parameter order, as newer Airflow writes them.
STUB_ARGUMENTS: Final[dict[str, list[dict[str, Any]]]] = {
    "extract": [
        literal_arg("source", "s3://orders/raw/2026-01-01", {"type": "string"}),
        literal_arg("since", None, NULLABLE_TIMESTAMP, from_default=True),
    ],
    "transform": [
        xcom_arg("rows", "extract", {"type": "array"}),
        literal_arg("currency", "EUR", {"type": "string"}),
        literal_arg("threshold", 100, {"type": "integer"}, from_default=True),
    ],
    "publish": [
        xcom_arg("summary", "transform", {"type": "object"}),
        literal_arg("channel", "#orders", {"type": "string"}),
    ],
}


def _handler(task_id: str, binding: str, *params: dict[str, Any]) -> dict[str, Any]:
    """One ``TaskHandlerDeclaration`` as a runtime sends it."""
    return {"task_id": task_id, "binding": binding, "params": list(params)}


def _param(name: str | None, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "value_schema": schema, **extra}


@dataclass(frozen=True)
class ExampleBundle:
    """One TaskHandlerBundle-to-be: one language, one queue, one artifact."""

    name: str
    language: Language
    queue: str
    rel_path: str
    handlers: Mapping[str, Any]  # TaskHandlerParsingResult.task_handlers, compiled in


# Positional and nameless, like a Go function's parameters.
GO_HANDLERS: Final = {
    DAG_ID: [
        _handler(
            "extract",
            "positional",
            _param(None, {"type": "string"}),
            _param(None, NULLABLE_TIMESTAMP),
        )
    ]
}
# Named; `Threshold` matches `threshold` by folded name, and takes the integer as a number.
JAVA_HANDLERS: Final = {
    DAG_ID: [
        _handler(
            "transform",
            "named",
            _param("rows", {"type": "array"}),
            _param("currency", {"type": "string"}, exact_name=True),
            _param("Threshold", {"type": "number"}),
        )
    ]
}
PUBLISH_PARAMS: Final = (
    _param("summary", {"type": "object"}),
    _param("channel", {"type": "string"}),
)
TYPESCRIPT_HANDLERS: Final = {DAG_ID: [_handler("publish", "named", *PUBLISH_PARAMS)]}

BUNDLES: Final = (
    ExampleBundle("orders-go", Language.GO, "go", "extract", GO_HANDLERS),
    ExampleBundle("orders-java", Language.JAVA, "java", "orders-transform.jar", JAVA_HANDLERS),
    ExampleBundle(
        "orders-typescript",
        Language.TYPESCRIPT,
        "typescript",
        "publish.min.mjs",
        TYPESCRIPT_HANDLERS,
    ),
)


def register_bundles(conn: Connection, commit: str, refreshed_at: datetime) -> None:
    """Airflow's ``dag_bundle`` rows for the three bundles, as its dag processor writes them
    for a ``GitDagBundle`` per bundle tracking the example repository at ``commit``: without
    them the operator reports ``DagBundleInSync=False`` (``UnknownDagBundle``), since workers
    download artifacts from the DagBundle of the binding's name."""
    for bundle in BUNDLES:
        register_dag_bundle(conn, bundle.name, commit, refreshed_at)
