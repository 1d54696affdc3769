"""Names of the TaskHandlerBundle resource and the labels and annotations the operator uses."""

from __future__ import annotations

from typing import Final

from taskhandler_operator.publication import policy

GROUP: Final = "langsdk.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "TaskHandlerBundle"
LIST_KIND: Final = "TaskHandlerBundleList"
PLURAL: Final = "taskhandlerbundles"
SINGULAR: Final = "taskhandlerbundle"
SHORT_NAMES: Final = ("thb",)
CATEGORIES: Final = ("langsdk",)
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
CRD_FILE: Final = f"crds/{CRD_NAME}.yaml"

# A Kubernetes object name used as a label value must fit a label value (63 characters).
MAX_BUNDLE_RESOURCE_NAME: Final = 63

# On a TaskHandlerBundle: the shard (operator instance) that reconciles it; without it, the
# default shard does (docs/operator.md, "Shards").
LABEL_SHARD: Final = f"{GROUP}/shard"

# Labels on everything the operator creates (probe Jobs and their pods).
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_BUNDLE: Final = f"{GROUP}/bundle"
LABEL_BUNDLE_UID: Final = f"{GROUP}/bundle-uid"
# On a probe Job: the hash of the pod template it was built from (a Deployment's
# pod-template-hash); part of its name too, and checked before a Job is adopted.
LABEL_TEMPLATE_HASH: Final = f"{GROUP}/pod-template-hash"
MANAGER: Final = "taskhandler-operator"
PROBE_APP: Final = "taskhandler-probe"

# Annotations on a probe Job: which artifact it probes, so a restarted operator reads it back.
ANNOTATION_ARTIFACT_PATH: Final = f"{GROUP}/artifact-path"
ANNOTATION_ARTIFACT_SIZE: Final = f"{GROUP}/artifact-size"
ANNOTATION_CACHE_DIGEST: Final = f"{GROUP}/cache-digest"

# On a TaskHandlerBundle: any new value asks for a reconcile now (Flux's requestedAt);
# the value handled last is echoed in status.lastHandledReconcileAt.
ANNOTATION_RECONCILE_REQUESTED_AT: Final = f"{GROUP}/reconcile-requested-at"
# "true" on a TaskHandlerBundle: its deletion leaves the database alone (rows and claim stay).
ANNOTATION_SKIP_CLEANUP: Final = f"{GROUP}/skip-cleanup"
#: Publication control (docs/operator.md, "Publication"): approve a held revision, roll back.
ANNOTATION_APPROVE_REVISION: Final = policy.ANNOTATION_APPROVE_REVISION
ANNOTATION_ROLLBACK_TO: Final = policy.ANNOTATION_ROLLBACK_TO
