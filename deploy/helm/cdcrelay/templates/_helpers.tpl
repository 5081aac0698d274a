{{/*
Chart name, truncated to a DNS label.
*/}}
{{- define "cdcrelay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Release full name. A source's objects are named "<fullname>-<source name>", with the
full name cut to 32 characters so that the result stays a DNS label.
*/}}
{{- define "cdcrelay.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cdcrelay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object of the release (commonLabels cannot override the chart's own).
*/}}
{{- define "cdcrelay.labels" -}}
{{- $own := dict
  "helm.sh/chart" (include "cdcrelay.chart" .)
  "app.kubernetes.io/name" (include "cdcrelay.name" .)
  "app.kubernetes.io/instance" .Release.Name
  "app.kubernetes.io/version" (toString .Chart.AppVersion)
  "app.kubernetes.io/managed-by" .Release.Service
  "app.kubernetes.io/part-of" "cdcrelay"
}}
{{- toYaml (merge $own (deepCopy (default dict .Values.commonLabels))) }}
{{- end }}

{{/*
Selector labels of one source. Argument: dict "root" $ "src" $src.
*/}}
{{- define "cdcrelay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cdcrelay.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: relay
cdcrelay.io/source: {{ .src.sourceLabel }}
{{- end }}

{{/*
All labels of one source's objects; with "extra" (a map), those are added below the
chart's own, which win. Argument: dict "root" $ "src" $src ["extra" map].
*/}}
{{- define "cdcrelay.sourceLabels" -}}
{{- $l := include "cdcrelay.labels" .root | fromYaml }}
{{- $l = merge (include "cdcrelay.selectorLabels" . | fromYaml) $l (deepCopy (default dict .extra)) }}
{{- toYaml $l }}
{{- end }}

{{- define "cdcrelay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cdcrelay.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cdcrelay.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
A scalar as an env var value. Numbers from values files arrive as float64 and
would print as 1.6777216e+07; integers print as integers.
*/}}
{{- define "cdcrelay.envString" -}}
{{- if kindIs "float64" . }}
{{- int64 . | toString }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/*
Whole seconds (rounded up) in a Go duration made of h, m, s and ms parts: "1m30s" -> 90.
*/}}
{{- define "cdcrelay.durationSeconds" -}}
{{- $d := toString . }}
{{- if not (regexMatch "^([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$" $d) }}
{{- fail (printf "cdcrelay: %q is not a duration such as 15s, 1m30s or 500ms" $d) }}
{{- end }}
{{- $h := regexFind "[0-9]+h" $d | trimSuffix "h" | atoi }}
{{- $m := regexFind "[0-9]+m([0-9]|$)" $d | regexFind "^[0-9]+" | atoi }}
{{- $s := regexFind "[0-9]+s" $d | trimSuffix "s" | atoi }}
{{- $ms := regexFind "[0-9]+ms" $d | trimSuffix "ms" | atoi }}
{{- add (mul $h 3600) (mul $m 60) $s (div (add $ms 999) 1000) }}
{{- end }}

{{/*
Resolves `source`/`sources` against `defaults` into a list of complete source
settings, checks what the schema cannot (one of the two forms, unique names and
slots, an AMQP Secret for every source), and stores the list in .out.items.
Argument: dict "root" $ "out" (dict).
*/}}
{{- define "cdcrelay.resolveSources" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $single := not (empty $v.source) }}
{{- $raw := list }}
{{- if and $single (not (empty $v.sources)) }}
{{- fail "cdcrelay: set either `source` (one database) or `sources` (a list), not both" }}
{{- else if $single }}
{{- $raw = list $v.source }}
{{- else if $v.sources }}
{{- $raw = $v.sources }}
{{- else }}
{{- fail "cdcrelay: no source configured: set `source` (one database) or `sources` (a list of databases); see the chart's values.yaml" }}
{{- end }}
{{- $fullname := include "cdcrelay.fullname" $root }}
{{- $items := list }}
{{- $seen := dict }}
{{- range $i, $src := $raw }}
{{- $name := default "" $src.name }}
{{- $where := ternary (printf "source %q" $name) (printf "source #%d" $i) (ne $name "") }}
{{- if and (not $single) (eq $name "") }}
{{- fail (printf "cdcrelay: %s in `sources` has no name" $where) }}
{{- end }}
{{- if not (and $src.database $src.database.secretName) }}
{{- fail (printf "cdcrelay: %s: database.secretName is required (the Secret holding the database URL)" $where) }}
{{- end }}
{{- $cfg := deepCopy $v.defaults }}
{{- range $k, $val := $src }}
{{- if eq $k "extraEnv" }}
{{- $_ := set $cfg "extraEnv" (concat (default list $v.defaults.extraEnv) (default list $val)) }}
{{- else if eq $k "columns" }}
{{- $_ := set $cfg "columns" (merge (deepCopy (default dict $val)) (deepCopy (default dict $v.defaults.columns))) }}
{{- else }}
{{- $_ := set $cfg $k $val }}
{{- end }}
{{- end }}
{{- $_ := set $cfg "name" $name }}
{{- $_ := set $cfg "sourceLabel" (default "default" $name) }}
{{- if $name }}
{{- $_ := set $cfg "resourceName" (printf "%s-%s" ($fullname | trunc 32 | trimSuffix "-") $name) }}
{{- else }}
{{- $_ := set $cfg "resourceName" $fullname }}
{{- end }}
{{- $derived := ternary (printf "cdcrelay_%s" (replace "-" "_" $name)) "cdcrelay_outbox" (ne $name "") }}
{{- $_ := set $cfg "slot" (default $derived $src.slot) }}
{{- $_ := set $cfg "publication" (default $derived $src.publication) }}
{{- if or (not (regexMatch "^[a-z0-9_]{1,54}$" $cfg.slot)) (hasSuffix "_adopting" $cfg.slot) }}
{{- fail (printf "cdcrelay: %s: slot %q must match ^[a-z0-9_]{1,54}$ and not end in _adopting (use a shorter source name, or set slot)" $where $cfg.slot) }}
{{- end }}
{{- if not (regexMatch "^([a-z_][a-z0-9_$]{0,62}|\"([^\"]|\"\"){1,63}\")$" $cfg.publication) }}
{{- fail (printf "cdcrelay: %s: publication %q must be a lower-case name of at most 63 characters, or a double-quoted one" $where $cfg.publication) }}
{{- end }}
{{- range $what := list "name" "resourceName" "slot" }}
{{- $key := printf "%s/%s" $what (get $cfg $what) }}
{{- if hasKey $seen $key }}
{{- fail (printf "cdcrelay: %s: %s %q is used by another source; each source needs its own" $where $what (get $cfg $what)) }}
{{- end }}
{{- $_ := set $seen $key true }}
{{- end }}
{{- $db := deepCopy $src.database }}
{{- $_ := set $db "key" (default "url" $db.key) }}
{{- $_ := set $cfg "database" $db }}
{{- $amqp := deepCopy (default dict $cfg.amqp) }}
{{- $_ := set $amqp "key" (default "url" $amqp.key) }}
{{- if not $amqp.secretName }}
{{- fail (printf "cdcrelay: %s: no AMQP Secret: set defaults.amqp.secretName, or amqp.secretName on the source" $where) }}
{{- end }}
{{- $_ := set $cfg "amqp" $amqp }}
{{- $stop := include "cdcrelay.durationSeconds" (default "15s" $cfg.shutdownTimeout) | atoi }}
{{- if kindIs "invalid" $cfg.terminationGracePeriodSeconds }}
{{- $_ := set $cfg "terminationGracePeriodSeconds" (add $stop 15) }}
{{- else if le (int64 $cfg.terminationGracePeriodSeconds) (int64 $stop) }}
{{- fail (printf "cdcrelay: %s: terminationGracePeriodSeconds (%s) must be above shutdownTimeout (%ds)" $where (include "cdcrelay.envString" $cfg.terminationGracePeriodSeconds) $stop) }}
{{- end }}
{{- $items = append $items $cfg }}
{{- end }}
{{- $_ := set .out "items" $items }}
{{- end }}

{{/*
The container's env list for one source. Argument: dict "root" $ "src" $src.
*/}}
{{- define "cdcrelay.env" -}}
{{- $src := .src }}
{{- $env := list }}
{{- range $t := list (list "DATABASE" $src.database "database") (list "AMQP" $src.amqp "amqp") }}
{{- $prefix := index $t 0 }}
{{- $ref := index $t 1 }}
{{- if $ref.mountAsFile }}
{{- $env = append $env (dict "name" (printf "CDCRELAY_%s_URL_FILE" $prefix) "value" (printf "/etc/cdcrelay/secrets/%s/url" (index $t 2))) }}
{{- else }}
{{- $env = append $env (dict "name" (printf "CDCRELAY_%s_URL" $prefix) "valueFrom" (dict "secretKeyRef" (dict "name" $ref.secretName "key" $ref.key))) }}
{{- end }}
{{- end }}
{{- $plain := list
  (list "SLOT" $src.slot)
  (list "PUBLICATION" $src.publication)
  (list "HTTP_ADDR" ":8080")
  (list "EXCHANGE" $src.exchange)
  (list "TABLE" $src.table)
  (list "ID_COLUMN" $src.columns.id)
  (list "ROUTING_KEY_COLUMN" $src.columns.routingKey)
  (list "PAYLOAD_COLUMN" $src.columns.payload)
  (list "HEADERS_COLUMN" $src.columns.headers)
  (list "EXCHANGE_COLUMN" $src.columns.exchange)
  (list "TYPE_COLUMN" $src.columns.type)
  (list "MAX_IN_FLIGHT" $src.maxInFlight)
  (list "MAX_IN_FLIGHT_BYTES" $src.maxInFlightBytes)
  (list "CONFIRM_TIMEOUT" $src.confirmTimeout)
  (list "STATUS_INTERVAL" $src.statusInterval)
  (list "SHUTDOWN_TIMEOUT" $src.shutdownTimeout)
  (list "BACKOFF_MIN" $src.backoffMin)
  (list "BACKOFF_MAX" $src.backoffMax)
  (list "AMQP_HEARTBEAT" $src.amqpHeartbeat)
  (list "LOG_LEVEL" $src.logLevel)
  (list "LOG_FORMAT" $src.logFormat)
}}
{{- range $p := $plain }}
{{- $val := index $p 1 }}
{{- if not (or (kindIs "invalid" $val) (eq (toString $val) "")) }}
{{- $env = append $env (dict "name" (printf "CDCRELAY_%s" (index $p 0)) "value" (include "cdcrelay.envString" $val)) }}
{{- end }}
{{- end }}
{{- /* extraEnv (defaults' entries, then the source's): an entry replaces a chart
entry of the same name, and of two extra entries with one name the later wins. */}}
{{- $extra := default list $src.extraEnv }}
{{- $extraByName := dict }}
{{- range $e := $extra }}
{{- $_ := set $extraByName $e.name $e }}
{{- end }}
{{- $out := list }}
{{- range $e := $env }}
{{- if not (hasKey $extraByName $e.name) }}
{{- $out = append $out $e }}
{{- end }}
{{- end }}
{{- $done := dict }}
{{- range $e := $extra }}
{{- if not (hasKey $done $e.name) }}
{{- $_ := set $done $e.name true }}
{{- $out = append $out (get $extraByName $e.name) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}
