"""The exact-definition comparison without a database: the model's side and the messages."""

from __future__ import annotations

import dataclasses

from taskhandler_operator.db.catalog import (
    ColumnDefinition,
    compare_definitions,
    expected_definition,
    index_body,
)
from taskhandler_operator.db.tables import metadata

ARTIFACT = expected_definition(metadata.tables["lang_sdk_task_handler_artifact"])
BINDING = expected_definition(metadata.tables["lang_sdk_task_handler"])


def test_the_model_gives_airflows_names_and_definitions() -> None:
    assert BINDING.constraints == {
        "lang_sdk_task_handler_pkey": "PRIMARY KEY (dag_id, task_id)",
        "lang_sdk_task_handler_dag_id_fkey": (
            "FOREIGN KEY (dag_id) REFERENCES dag(dag_id) ON DELETE CASCADE"
        ),
        "lang_sdk_task_handler_artifact_id_fkey": (
            "FOREIGN KEY (artifact_id) REFERENCES lang_sdk_task_handler_artifact(id)"
        ),
    }
    assert ARTIFACT.indexes == {
        "lang_sdk_task_handler_artifact_pkey": "UNIQUE btree (id)",
        "lang_sdk_task_handler_artifact_bundle_fileloc_uq": (
            "UNIQUE btree (bundle_name, relative_fileloc_hash)"
        ),
        "idx_lang_sdk_task_handler_artifact_last_probed_at": "btree (last_probed_at)",
    }
    assert ARTIFACT.columns["last_probed_at"] == ColumnDefinition(
        name="last_probed_at", type="timestamp with time zone", not_null=True
    )
    assert ARTIFACT.columns["cache_digest"].type == "character varying(128)"
    assert ARTIFACT.comment is None and compare_definitions(ARTIFACT, ARTIFACT) == []


def test_server_defaults_render_as_the_catalog_does() -> None:
    problems = expected_definition(metadata.tables["thop_bundle_problem"])
    assert problems.columns["first_seen_at"].default == "now()"


def test_index_body_drops_the_names() -> None:
    assert (
        index_body("CREATE UNIQUE INDEX x ON public.t USING btree (a, b) WHERE (a > 0)")
        == "UNIQUE btree (a, b) WHERE (a > 0)"
    )
    assert index_body("CREATE INDEX x ON ONLY public.t USING hash (a)") == "hash (a)"


def test_differences_are_named_and_a_rename_is_said_as_such() -> None:
    columns = dict(ARTIFACT.columns)
    columns["size_bytes"] = dataclasses.replace(columns["size_bytes"], type="integer")
    columns["extra"] = ColumnDefinition(name="extra", type="text", not_null=False)
    del columns["cache_digest"]
    constraints = dict(ARTIFACT.constraints)
    constraints["old_uq"] = constraints.pop("lang_sdk_task_handler_artifact_bundle_fileloc_uq")
    indexes = {
        name: body
        for name, body in ARTIFACT.indexes.items()
        if name != "idx_lang_sdk_task_handler_artifact_last_probed_at"
    }
    indexes["old_uq"] = indexes.pop("lang_sdk_task_handler_artifact_bundle_fileloc_uq")
    observed = dataclasses.replace(
        ARTIFACT,
        columns=columns,
        constraints=constraints,
        indexes=indexes,
        comment="created by taskhandler-operator",
        constraint_indexes=frozenset({"lang_sdk_task_handler_artifact_pkey", "old_uq"}),
    )
    assert compare_definitions(ARTIFACT, observed, "Airflow's model") == [
        "column 'size_bytes' is integer NOT NULL, Airflow's model has bigint NOT NULL",
        "column 'cache_digest' (character varying(128)) is missing",
        "column 'extra' (text) is not in Airflow's model",
        "constraint 'old_uq' (UNIQUE (bundle_name, relative_fileloc_hash)) is named "
        "'lang_sdk_task_handler_artifact_bundle_fileloc_uq' in Airflow's model",
        "index 'idx_lang_sdk_task_handler_artifact_last_probed_at' (btree (last_probed_at)) is "
        "missing",
        "table comment 'created by taskhandler-operator' is not in Airflow's model",
    ]
