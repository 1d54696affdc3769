{{/* Names, labels and the values every template shares. */}}

{{- define "thop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "thop.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The operator's pods: what the Service, the NetworkPolicies and the Deployment select. */}}
{{- define "thop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "thop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "thop.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "thop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "thop.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "thop.serviceAccountName" -}}
{{- include "thop.fullname" . -}}
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

{{- define "thop.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "thop.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}
