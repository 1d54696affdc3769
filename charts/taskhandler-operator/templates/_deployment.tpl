{{- /* One operator Deployment: the default shard, or one of `shards` (its overrides applied to
the values). Called with (dict "root" <root context> "shard" <shard name, "" for the default>
"values" <the values it runs with>); the selector scheme is explained in _helpers.tpl. */ -}}
{{- define "thop.deployment" -}}
{{- $root := .root -}}
{{- $shard := .shard -}}
{{- $v := .values -}}
{{- $fullname := include "thop.fullname" $root -}}
{{- $name := $fullname -}}
{{- $selector := include "thop.selectorLabels" $root -}}
{{- $artifactUrl := include "thop.artifactServerUrl" $root -}}
{{- /* The default shard's checksum is today's, taken over every value but `shards`: adding or
changing a shard rolls only that shard's pods. */ -}}
{{- $checksum := toJson (omit $root.Values "shards") -}}
{{- if $shard -}}
{{- $name = printf "%s-%s" $fullname $shard -}}
{{- $selector = include "thop.shardSelectorLabels" (list $root $shard) -}}
{{- $artifactUrl = $v.artifactServer.url | default (printf "http://%s.%s.svc:%d" $name $root.Release.Namespace (int $v.ports.artifactServer)) -}}
{{- $checksum = toJson $v -}}
{{- end -}}
{{- if eq (int $v.ports.metrics) (int $v.ports.health) }}
{{- fail "ports.metrics and ports.health must differ" }}
{{- end }}
{{- /* The revision store's claim is ReadWriteOnce: a second replica on another node could
never mount it, and would be the standby that must take over at once. */ -}}
{{- if and (gt (int $v.replicaCount) 1) (eq $v.revisionStore.type "persistentVolumeClaim") (not $v.revisionStore.persistentVolumeClaim.existingClaim) -}}
{{- fail (printf "revisionStore.type=persistentVolumeClaim creates a ReadWriteOnce claim, which only one replica can mount: use replicaCount=1%s, revisionStore.type=emptyDir, or an existingClaim that is ReadWriteMany" (ternary (printf " (shard %s)" $shard) "" (ne $shard ""))) -}}
{{- end }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "thop.labels" $root | nindent 4 }}
    {{- if $shard }}
    langsdk.dev/shard: {{ $shard }}
    {{- end }}
spec:
  replicas: {{ $v.replicaCount }}
  {{- if eq (int $v.replicaCount) 1 }}
  # One replica: the old pod releases the Lease and stops before the new one starts.
  strategy:
    type: Recreate
  {{- else }}
  # Only the leader is Ready, so a rolling update that waits for readiness would stall:
  # replace every pod at once; the standby-to-be waits for the Lease the old leader releases.
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 0
      maxUnavailable: 100%
  {{- end }}
  selector:
    matchLabels:
      {{- $selector | nindent 6 }}
  template:
    metadata:
      labels:
        {{- if $shard }}
        {{- include "thop.commonLabels" $root | nindent 8 }}
        app.kubernetes.io/component: operator-shard
        langsdk.dev/shard: {{ $shard }}
        {{- else }}
        {{- include "thop.labels" $root | nindent 8 }}
        {{- end }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        # Any changed value rolls the pods, including ones read from mounted files.
        # Quoted: 16 hex digits such as 8790955697426e98 would otherwise be read as a number.
        checksum/settings: {{ $checksum | sha256sum | trunc 16 | quote }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "thop.serviceAccountName" $root }}
      securityContext:
        {{- include "thop.podSecurityContext" $root | nindent 8 }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- include "thop.imagePullSecrets" . | nindent 8 }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      terminationGracePeriodSeconds: 30
      containers:
        - name: operator
          image: {{ include "thop.image" $root }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          command: ["taskhandler-operator"]
          args: ["run"]
          env:
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            - name: THOP_DATABASE_URL_FILE
              value: /etc/taskhandler-operator/database/url
            - name: THOP_CLUSTER_ID
              value: {{ include "thop.clusterId" $root | quote }}
            {{- if $shard }}
            # The operator takes only bundles labelled langsdk.dev/shard=<shard>, under the
            # Lease taskhandler-operator-<shard> (docs/settings.md).
            - name: THOP_SHARD
              value: {{ $shard | quote }}
            {{- end }}
            {{- if eq $v.watch.mode "namespaced" }}
            - name: THOP_NAMESPACES
              value: {{ include "thop.probeNamespaces" $root | fromJsonArray | join "," | quote }}
            {{- end }}
            - name: THOP_ARTIFACT_SERVER_BIND
              value: "0.0.0.0:{{ $v.ports.artifactServer }}"
            - name: THOP_ARTIFACT_SERVER_URL
              value: {{ $artifactUrl | quote }}
            - name: THOP_SIGNING_KEY_FILE
              value: /etc/taskhandler-operator/signing-key/key
            - name: THOP_OPERATOR_IMAGE
              value: {{ include "thop.image" $root | quote }}
            - name: THOP_PROBE_SERVICE_ACCOUNT
              value: {{ $v.probe.serviceAccountName | quote }}
            - name: THOP_PROBE_PARALLELISM
              value: {{ $v.probe.parallelism | quote }}
            - name: THOP_PROBE_IMAGE_PULL_POLICY
              value: {{ $v.probe.imagePullPolicy | quote }}
            {{- range $language, $image := $v.probe.runtimeImages }}
            {{- if $image.repository }}
            - name: THOP_RUNTIME_IMAGES__{{ upper $language }}
              value: {{ include "thop.imageRef" (list $image $root) | quote }}
            {{- end }}
            {{- end }}
            - name: THOP_METRICS_PORT
              value: {{ $v.ports.metrics | quote }}
            - name: THOP_HEALTH_PORT
              value: {{ $v.ports.health | quote }}
            - name: THOP_LOG_FORMAT
              value: {{ $v.logging.format | quote }}
            - name: THOP_LOG_LEVEL
              value: {{ $v.logging.level | quote }}
            - name: THOP_REVISION_STORE
              value: /var/lib/taskhandler-operator/revisions
            - name: THOP_REVISIONS_KEPT
              value: {{ $v.revisionStore.revisionsKept | quote }}
            {{- with $v.database.timeouts }}
            - name: THOP_DATABASE_CONNECT_TIMEOUT
              value: {{ .connect | quote }}
            - name: THOP_DATABASE_STATEMENT_TIMEOUT
              value: {{ .statement | quote }}
            - name: THOP_DATABASE_LOCK_TIMEOUT
              value: {{ .lock | quote }}
            - name: THOP_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT
              value: {{ .idleInTransaction | quote }}
            - name: THOP_DATABASE_TCP_USER_TIMEOUT
              value: {{ .tcpUserTimeout | quote }}
            - name: THOP_DATABASE_KEEPALIVES_IDLE
              value: {{ .keepalivesIdle | quote }}
            {{- end }}
            - name: THOP_PASS_TIMEOUT
              value: {{ $v.passTimeout | quote }}
            {{- with $v.volumeSources.roots }}
            - name: THOP_VOLUME_ROOTS
              value: {{ join "," . | quote }}
            {{- end }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: artifacts
              containerPort: {{ $v.ports.artifactServer }}
              protocol: TCP
            - name: metrics
              containerPort: {{ $v.ports.metrics }}
              protocol: TCP
            - name: health
              containerPort: {{ $v.ports.health }}
              protocol: TCP
          # /healthz fails only when a loop of the operator is stuck (docs/operator.md); the
          # startup probe gives the start (database, caches, the health server) two minutes
          # and holds the liveness probe back until then.
          startupProbe:
            httpGet:
              path: /healthz
              port: health
            periodSeconds: 2
            timeoutSeconds: 3
            failureThreshold: 60
          livenessProbe:
            httpGet:
              path: /healthz
              port: health
            periodSeconds: 20
            timeoutSeconds: 5
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /readyz
              port: health
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 2
          securityContext:
            {{- include "thop.restrictedContainer" $root | nindent 12 }}
          {{- with $v.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: database-url
              mountPath: /etc/taskhandler-operator/database
              readOnly: true
            - name: signing-key
              mountPath: /etc/taskhandler-operator/signing-key
              readOnly: true
            - name: revisions
              mountPath: /var/lib/taskhandler-operator
            - name: tmp
              mountPath: /tmp
            {{- with $v.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: database-url
          secret:
            secretName: {{ include "thop.databaseSecret" $root }}
            items:
              - key: {{ $v.database.secretKey }}
                path: url
        - name: signing-key
          secret:
            secretName: {{ include "thop.signingKeySecret" $root }}
            items:
              - key: {{ $v.signingKey.secretKey }}
                path: key
        - name: revisions
          {{- if eq $v.revisionStore.type "persistentVolumeClaim" }}
          persistentVolumeClaim:
            claimName: {{ default (printf "%s-revisions" $name) $v.revisionStore.persistentVolumeClaim.existingClaim }}
          {{- else }}
          emptyDir:
            sizeLimit: {{ $v.revisionStore.sizeLimit }}
          {{- end }}
        - name: tmp
          emptyDir:
            sizeLimit: 1Gi
        {{- with $v.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if $v.affinity }}
      affinity:
        {{- toYaml $v.affinity | nindent 8 }}
      {{- else if gt (int $v.replicaCount) 1 }}
      # Spread the replicas over nodes where the scheduler can, so the standby outlives the
      # leader's node; soft, so a one-node cluster still runs them all.
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- $selector | nindent 20 }}
      {{- end }}
      {{- with $v.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}
