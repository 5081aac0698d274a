{{/*
One alerting rule as YAML, for prometheusrule.yaml. Argument: dict
  "pr" .Values.monitoring.prometheusRule, "cfg" the alert's values (for, severity),
  "name", "expr", "summary", "description", and optionally "static" (labels).
The chart's severity and static labels win over alertLabels. runbook_url points at
the alert's `## <Name>` heading in docs/runbook.md (GitHub's anchor: the lower-case name).
*/}}
{{- define "cdcrelay.alertRule" -}}
{{- $labels := merge (dict "severity" (toString .cfg.severity)) (deepCopy (default dict .static)) (deepCopy (default dict .pr.alertLabels)) }}
{{- $ann := dict "summary" .summary "description" .description "runbook_url" (printf "%s#%s" .pr.runbookBaseURL (lower .name)) }}
{{- toYaml (dict "alert" .name "expr" .expr "for" (toString .cfg.for) "labels" $labels "annotations" $ann) }}
{{- end }}

{{/*
A threshold as a PromQL number literal: whole numbers without an exponent (values
files give float64, which would print 1.073741824e+09), fractions as they are.
*/}}
{{- define "cdcrelay.promNumber" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) }}
{{- int64 . }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}
