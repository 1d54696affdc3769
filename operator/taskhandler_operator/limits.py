"""Every size limit of the operator, defined once (pure; imports nothing).

Three kinds, each imported by the modules that enforce it:

* **storage widths**: the column lengths of the tables we write. The Airflow-named tables fix
  theirs (ADR-0013 Design B), so the models that feed them bound their fields by the same numbers;
* **wire bounds**: what a probe accepts from a runtime and reports back through Kubernetes;
* **reader caps**: how much of an untrusted artifact a reader parses before it calls the
  artifact unreadable.

Caps on how many items a message quotes are presentation, and stay beside the message. Migrations
keep literal widths: a migration is history and must not change when a constant does; a test
compares the migrated schema with the models, which use these names.
"""

from __future__ import annotations

from typing import Final

# --- storage widths ----------------------------------------------------------------------------

#: ``dag_id``, ``task_id``, bundle names: the width Airflow gives ``dag.dag_id`` and
#: ``dag_bundle.name``.
ID_LENGTH: Final = 250
#: Relative paths of artifacts and Dag files (``relative_fileloc``).
PATH_LENGTH: Final = 2000
#: A 32-hex MD5: of a relative path (``*_fileloc_hash``), of a problem (``problem_key``), and
#: Airflow's ``serialized_dag.dag_hash``.
MD5_HEX_LENGTH: Final = 32
#: ``lang_sdk_task_handler_artifact.cache_digest``. A longer stored digest cannot be recorded, so
#: the listing treats it as absent (the artifact is then probed every time).
CACHE_DIGEST_LENGTH: Final = 128
#: A source revision (a git commit, ``sha256:<hex>`` of an archive, a listing digest).
REVISION_LENGTH: Final = 200
#: ``thop_publication.kind``: published, approved, rolled_back, held.
PUBLICATION_KIND_LENGTH: Final = 16
#: ``thop_bundle_problem.severity`` and ``.kind``.
PROBLEM_SEVERITY_LENGTH: Final = 16
PROBLEM_KIND_LENGTH: Final = 32
#: ``thop_table_origin.created_by`` ("taskhandler-operator" or "airflow").
ORIGIN_LENGTH: Final = 32
#: Kubernetes names (a namespace, a resource name; RFC 1123 subdomain) and object uids.
KUBE_NAME_LENGTH: Final = 253
KUBE_UID_LENGTH: Final = 64
#: The operator's cluster identity as configured (``THOP_CLUSTER_ID``).
CLUSTER_ID_LENGTH: Final = 253
#: An Airflow queue name (the width of ``task_instance.queue``).
QUEUE_LENGTH: Final = 256

# --- wire bounds -------------------------------------------------------------------------------

#: Largest frame body a probe reads from a runtime (a handler list of a large bundle fits).
MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
#: The kubelet truncates termination messages to 4096 bytes; a probe summary stays well under.
MAX_SUMMARY_BYTES: Final = 3072
#: JSON-encoded size of the summary's free-text fields (a runtime can put control characters
#: into an error text, and each of those takes six bytes once escaped).
MAX_SUMMARY_ERROR_BYTES: Final = 1200
MAX_SUMMARY_ARTIFACT_BYTES: Final = 400
#: Process ids a summary lists (of processes left behind by a runtime).
MAX_SUMMARY_PIDS: Final = 16
#: Warnings an ok summary carries, and the JSON-encoded size of each; they ride on ok summaries
#: only, which carry no error text, so they fit in its budget.
MAX_SUMMARY_WARNINGS: Final = 2
MAX_SUMMARY_WARNING_BYTES: Final = 500
#: Dags a parse request names in ``dag_ids`` (``probe --dag-id``).
MAX_REQUEST_DAG_IDS: Final = 10_000
#: Bytes of those ids the operator puts in one probe Job: they travel as container arguments,
#: which share the pod object's size limit (etcd's 1.5 MiB) and the kernel's argument space.
MAX_REQUEST_DAG_ID_BYTES: Final = 256 * 1024
#: Characters of one runtime log event quoted in the probe's own log.
MAX_RELAYED_EVENT_CHARS: Final = 512

# --- reader caps -------------------------------------------------------------------------------

#: Go: the format caps nothing below 4 GiB; this keeps a hostile bundle from making the operator
#: parse an arbitrarily large YAML document.
GO_MAX_METADATA_BYTES: Final = 1 << 20
#: Java: a manifest is a few hundred bytes; signed JARs list per-entry digests and can reach
#: hundreds of kilobytes. Larger is treated as unreadable, before inflating anything.
JAVA_MAX_MANIFEST_BYTES: Final = 4 << 20
#: Java: a ``Main-Class`` (a binary class name) longer than this is refused.
JAVA_MAX_CLASS_NAME: Final = 1024
#: Java: verification inflates every entry to check its CRC-32; archives declaring more are refused.
JAVA_MAX_UNCOMPRESSED_BYTES: Final = 4 << 30
#: TypeScript: the first line (layout), the metadata line and each embedded source.
TS_MAX_LAYOUT_LINE: Final = 4096
TS_MAX_METADATA_LINE: Final = 1 << 20
TS_MAX_SOURCE_BYTES: Final = 1 << 20
#: Characters of an untrusted value (a path, a class name, a version) quoted in a message.
MAX_QUOTED_CHARS: Final = 80
#: Seconds a verification may take when the caller gives no bound (``verify``); a probe uses
#: its ``--timeout``. Hashing is the slow part: a 2 GiB artifact takes a few seconds.
VERIFY_TIMEOUT_S: Final = 300.0
#: Java: the central directory verification parses (zipfile keeps an object per entry, so this
#: bounds its memory; a JAR of 100,000 entries has a directory of about 8 MiB).
JAVA_MAX_CENTRAL_DIRECTORY_BYTES: Final = 32 << 20
#: ``plan --known FILE``: the known-artifact list read from a file (a bundle's answers).
KNOWN_ARTIFACTS_MAX_BYTES: Final = 64 << 20
#: Listing cache entries kept (one per file of every bundle root listed).
LISTING_CACHE_MAX_ENTRIES: Final = 100_000
