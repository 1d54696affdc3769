{{/* Shared by servicemonitor.yaml, podmonitor.yaml and prometheusrule.yaml. */}}

{{/* A Prometheus duration ("1m30s", "500ms") in milliseconds. */}}
{{- define "thop.durationMs" -}}
{{- $total := 0 -}}
{{- $unit := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 -}}
{{- $total = add $total (mul (regexFind "^[0-9]+" . | int) (get $unit (regexReplaceAll "^[0-9]+" . ""))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* The scrape endpoint of the ServiceMonitor and the PodMonitor; called with (list <monitor
values> <values key>). honorLabels: the per-bundle metrics carry the bundle's own `namespace`
label, which must win over the target's (the operator's) namespace, or Prometheus renames it
`exported_namespace` and the alerts, grouped by (namespace, name), merge same-named bundles of
different namespaces. Metrics without a namespace label of their own (the leader gauge, the
artifact server's requests) still get the target's, which TaskHandlerOperatorNoLeader reads. */}}
{{- define "thop.scrapeEndpoint" -}}
{{- $m := index . 0 -}}
{{- $key := index . 1 -}}
{{- if $m.scrapeTimeout -}}
{{- if gt (include "thop.durationMs" $m.scrapeTimeout | int) (include "thop.durationMs" $m.interval | int) -}}
{{- fail (printf "%s.scrapeTimeout (%s) must not exceed %s.interval (%s)" $key $m.scrapeTimeout $key $m.interval) -}}
{{- end -}}
{{- end -}}
- port: metrics
  path: /metrics
  interval: {{ $m.interval }}
  {{- with $m.scrapeTimeout }}
  scrapeTimeout: {{ . }}
  {{- end }}
  honorLabels: true
{{- end -}}

{{/* Both monitors would scrape every replica twice (and double every counter's increase). */}}
{{- define "thop.monitorCheck" -}}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled -}}
{{- fail "serviceMonitor.enabled and podMonitor.enabled are exclusive: enable one of them" -}}
{{- end -}}
{{- end -}}

{{/* An alert's runbook: its section of docs/operations.md ("#### <AlertName>", whose anchor is
the lower-cased name). Called with (list <prometheusRule values> "<AlertName>"). */}}
{{- define "thop.runbookUrl" -}}
{{- printf "%s#%s" (index . 0).runbookBaseUrl (lower (index . 1)) -}}
{{- end -}}
