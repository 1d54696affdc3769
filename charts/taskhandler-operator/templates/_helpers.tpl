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


{{/* Shards (issue 24; docs/install.md, "Shards"). The Deployment above the `shards` list is
the default shard and keeps its objects and its selector exactly (a Deployment's selector is
immutable, so an upgrade must not touch it). Each entry of `shards` adds a Deployment
"<fullname>-<shard>" whose pods run with THOP_SHARD=<shard>.

Selector scheme: the default Deployment and Service select {name, instance,
component=operator}. A shard's pods carry component=operator-shard instead (so the default
selector never matches them) and langsdk.dev/shard=<shard>; the shard's Deployment and Service
select {name, instance, component=operator-shard, langsdk.dev/shard=<shard>}, which neither
matches the default pods (other component, no shard label) nor another shard's (other shard
value). The objects themselves (Deployment, Service, PVC) keep component=operator, plus the
shard label, so the ServiceMonitor's Service selector covers every shard unchanged. Whatever
selects every operator pod (the NetworkPolicies, the PodMonitor) uses "thop.operatorPods". */}}

{{/* The pods of one shard's Deployment and Service; called with (list <root> <shard>). */}}
{{- define "thop.shardSelectorLabels" -}}
{{- $root := index . 0 -}}
{{ include "thop.instanceLabels" $root }}
app.kubernetes.io/component: operator-shard
langsdk.dev/shard: {{ index . 1 }}
{{- end -}}

{{/* A label selector (the body under `podSelector:` or `selector:`) of every operator pod of
the release, all shards. Without shards, exactly the default selector. */}}
{{- define "thop.operatorPods" -}}
{{- if .Values.shards -}}
matchLabels:
  {{- include "thop.instanceLabels" . | nindent 2 }}
matchExpressions:
  - key: app.kubernetes.io/component
    operator: In
    values: [operator, operator-shard]
{{- else -}}
matchLabels:
  {{- include "thop.selectorLabels" . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* The values of one shard: the release's values with the entry's overrides (replicaCount,
resources, ports, probe.parallelism, artifactServer.url) in place, as JSON (read back with
fromJson). Called with (list <root> <shard entry>). */}}
{{- define "thop.shardValues" -}}
{{- $root := index . 0 -}}
{{- $shard := index . 1 -}}
{{- $v := deepCopy (omit $root.Values "shards") -}}
{{- if hasKey $shard "replicaCount" -}}
{{- $_ := set $v "replicaCount" $shard.replicaCount -}}
{{- end -}}
{{- if hasKey $shard "resources" -}}
{{- $_ := set $v "resources" $shard.resources -}}
{{- end -}}
{{- with $shard.ports -}}
{{- $_ := set $v "ports" (merge (deepCopy .) $v.ports) -}}
{{- end -}}
{{- with $shard.probe -}}
{{- if hasKey . "parallelism" -}}
{{- $_ := set $v.probe "parallelism" .parallelism -}}
{{- end -}}
{{- end -}}
{{- $url := "" -}}
{{- with $shard.artifactServer -}}
{{- $url = .url | default "" -}}
{{- end -}}
{{- if and $root.Values.artifactServer.url (not $url) -}}
{{- fail (printf "shards: %s has no artifactServer.url while artifactServer.url is set: that URL reaches the default shard's artifact server, not this shard's; give the shard its own" $shard.name) -}}
{{- end -}}
{{- $_ := set $v "artifactServer" (dict "url" $url) -}}
{{- toJson $v -}}
{{- end -}}

{{/* The shard list's own rules, beyond the schema (which checks each name): names unique, and
"<fullname>-<shard>", a Service name, a DNS label of at most 63 characters. */}}
{{- define "thop.checkShards" -}}
{{- $seen := dict -}}
{{- $fullname := include "thop.fullname" . -}}
{{- range .Values.shards -}}
{{- if hasKey $seen .name -}}
{{- fail (printf "shards: the name %s is listed twice; each shard needs its own name" .name) -}}
{{- end -}}
{{- $_ := set $seen .name true -}}
{{- if gt (len (printf "%s-%s" $fullname .name)) 63 -}}
{{- fail (printf "shards: %s-%s, the Service of shard %s, is longer than 63 characters: shorten the shard name or fullnameOverride" $fullname .name .name) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.shards (eq .Values.revisionStore.type "persistentVolumeClaim") .Values.revisionStore.persistentVolumeClaim.existingClaim -}}
{{- fail "shards need a revision store each: with shards, use revisionStore.type=emptyDir or the claims the chart creates (no revisionStore.persistentVolumeClaim.existingClaim)" -}}
{{- end -}}
{{- end -}}

{{/* Every operator Deployment of the release as a JSON list of {shard, name, values}: the
default shard ("", <fullname>, the values) first, then each of `shards` ("<fullname>-<shard>",
its values from "thop.shardValues"). Read back with fromJsonArray. */}}
{{- define "thop.instances" -}}
{{- $fullname := include "thop.fullname" . -}}
{{- $all := list (dict "shard" "" "name" $fullname "values" (omit .Values "shards")) -}}
{{- range .Values.shards -}}
{{- $all = append $all (dict "shard" .name "name" (printf "%s-%s" $fullname .name) "values" (include "thop.shardValues" (list $ .) | fromJson)) -}}
{{- end -}}
{{- toJson $all -}}
{{- end -}}

{{/* The distinct values of one port (artifactServer, metrics, health) over every Deployment,
for the NetworkPolicies: a shard may override its ports (host-network pods). */}}
{{- define "thop.portsOf" -}}
{{- $root := index . 0 -}}
{{- $key := index . 1 -}}
{{- $ports := list -}}
{{- range include "thop.instances" $root | fromJsonArray -}}
{{- $ports = append $ports (int (get .values.ports $key)) -}}
{{- end -}}
{{- toJson (uniq $ports) -}}
{{- end -}}
