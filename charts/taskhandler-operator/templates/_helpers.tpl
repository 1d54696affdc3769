{{/* Names, labels and the values every template shares. */}}

{{- define "thop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* At most 52 characters, so the longest derived name, "<fullname>-db-upgrade" (63), and
the Job's pods' controller-uid-free names stay valid DNS labels. */}}
{{- define "thop.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name and instance: common to every object of the release. */}}
{{- define "thop.instanceLabels" -}}
app.kubernetes.io/name: {{ include "thop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The operator's pods: what the Service, the NetworkPolicies and the Deployment select. The
component keeps the migration Job's pods (component db-upgrade) out of the Service. */}}
{{- define "thop.selectorLabels" -}}
{{ include "thop.instanceLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Labels of every object; templates add their own component where it differs. */}}
{{- define "thop.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "thop.instanceLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels of the operator's objects (Deployment, Service, its RBAC, ...). */}}
{{- define "thop.labels" -}}
{{ include "thop.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* An image reference from {repository, tag, digest}: repository@digest when a digest is set
(it pins the content; the tag is then ignored), else repository:tag, the tag defaulting to the
chart's appVersion. Called with (list <image values> <root context>). */}}
{{- define "thop.imageRef" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "thop.image" -}}
{{- include "thop.imageRef" (list .Values.image .) -}}
{{- end -}}

{{/* imagePullSecrets entries: {name} objects, the shape every mainstream chart takes. */}}
{{- define "thop.imagePullSecrets" -}}
{{- range . }}
- name: {{ .name }}
{{- end }}
{{- end -}}

{{- define "thop.serviceAccountName" -}}
{{- include "thop.fullname" . -}}
{{- end -}}

{{/* The URL probe pods download from (THOP_ARTIFACT_SERVER_URL); helm test checks it too. */}}
{{- define "thop.artifactServerUrl" -}}
{{- .Values.artifactServer.url | default (printf "http://%s.%s.svc:%d" (include "thop.fullname" .) .Release.Namespace (int .Values.ports.artifactServer)) -}}
{{- end -}}

{{- define "thop.signingKeySecret" -}}
{{- default (printf "%s-signing-key" (include "thop.fullname" .)) .Values.signingKey.existingSecret -}}
{{- end -}}

{{- define "thop.databaseSecret" -}}
{{- required "database.existingSecret is required: the name of a Secret holding Airflow's database URL (the URL is never a plain value)" .Values.database.existingSecret -}}
{{- end -}}

{{/* Namespaces the operator serves: where the probe ServiceAccount and NetworkPolicy go. */}}
{{- define "thop.probeNamespaces" -}}
{{- if eq .Values.watch.mode "namespaced" -}}
{{- if not .Values.watch.namespaces -}}
{{- fail "watch.namespaces must list at least one namespace when watch.mode is namespaced" -}}
{{- end -}}
{{- toJson (uniq .Values.watch.namespaces) -}}
{{- else if .Values.probe.namespaces -}}
{{- toJson (uniq .Values.probe.namespaces) -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* The cluster id: the value, else the kube-system namespace's uid read at install. */}}
{{- define "thop.clusterId" -}}
{{- if .Values.clusterId -}}
{{- .Values.clusterId -}}
{{- else -}}
{{- $ns := lookup "v1" "Namespace" "" "kube-system" -}}
{{- if and $ns $ns.metadata -}}
{{- $ns.metadata.uid -}}
{{- else -}}
{{- fail "clusterId is empty and the kube-system namespace cannot be read (helm template has no cluster): set clusterId" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The security contexts come from values (securityContext, podSecurityContext); their
defaults are the restricted profile with UID/GID 65532. A key set to null is left out, so the
platform may choose it (OpenShift's restricted-v2 assigns the UID). */}}
{{- define "thop.restrictedContainer" -}}
{{- toYaml (.Values.securityContext | default dict) -}}
{{- end -}}

{{- define "thop.podSecurityContext" -}}
{{- toYaml (.Values.podSecurityContext | default dict) -}}
{{- end -}}

{{/* The revision store's claim is ReadWriteOnce: a second replica on another node could never
mount it, and would be the standby that must take over at once. */}}
{{- define "thop.checkReplicas" -}}
{{- if and (gt (int .Values.replicaCount) 1) (eq .Values.revisionStore.type "persistentVolumeClaim") (not .Values.revisionStore.persistentVolumeClaim.existingClaim) -}}
{{- fail "revisionStore.type=persistentVolumeClaim creates a ReadWriteOnce claim, which only one replica can mount: use replicaCount=1, revisionStore.type=emptyDir, or an existingClaim that is ReadWriteMany" -}}
{{- end -}}
{{- end -}}
