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

{{/*
Labels of one source's pod template: its labels without helm.sh/chart and
app.kubernetes.io/version. Those change with every chart release, and on the pod
template they would roll every relay (one slot failover each) on an upgrade that
changes nothing in the pod. Argument: dict "root" $ "src" $src ["extra" map].
*/}}
{{- define "cdcrelay.podLabels" -}}
{{- $l := include "cdcrelay.sourceLabels" . | fromYaml }}
{{- $_ := unset $l "helm.sh/chart" }}
{{- $_ := unset $l "app.kubernetes.io/version" }}
{{- toYaml $l }}
{{- end }}

{{- define "cdcrelay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cdcrelay.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The repository image.repository defaults to, which nothing publishes: the chart
refuses to render a relay with it.
*/}}
{{- define "cdcrelay.placeholderImage" -}}
ghcr.io/cdcrelay/cdcrelay
{{- end }}

{{/*
The relay's image, refused while it is the placeholder (with a global.imageRegistry,
where one may have pushed the image under the same path, it is not). global.imageRegistry
(as in bitnami charts, for a registry mirror) replaces the registry host of
image.repository, the first path component when it looks like a host (it has a "." or a
":", or is localhost), and is put in front of a repository without one.
*/}}
{{- define "cdcrelay.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- $repo := .Values.image.repository }}
{{- $registry := "" }}
{{- with .Values.global }}
{{- $registry = default "" .imageRegistry | trimSuffix "/" }}
{{- end }}
{{- if $registry }}
{{- $parts := splitn "/" 2 $repo }}
{{- if and $parts._1 (or (contains "." $parts._0) (contains ":" $parts._0) (eq $parts._0 "localhost")) }}
{{- $repo = $parts._1 }}
{{- end }}
{{- $repo = printf "%s/%s" $registry $repo }}
{{- end }}
{{- if eq $repo (include "cdcrelay.placeholderImage" .) }}
{{- fail (printf "cdcrelay: the image %s is the chart's placeholder, and nothing publishes it (the pods would never pull it): build the image with `make image`, push it to a registry your cluster pulls from, and set image.repository and image.tag (or image.digest) to it; see deploy/helm/README.md, \"The image\"" $repo) }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{/*
metadata.annotations of an object: commonAnnotations, then the object's own
("own", a map), which win. Renders nothing when both are empty, so that an object
without annotations stays as it was. Argument: dict "root" $ ["own" map].
Renders `annotations:` and the map, at column 0, or nothing:
  {{- with include "cdcrelay.annotations" (dict "root" $) }}
  {{- . | nindent 2 }}
  {{- end }}
*/}}
{{- define "cdcrelay.annotations" -}}
{{- $a := merge (deepCopy (default dict .own)) (deepCopy (default dict .root.Values.commonAnnotations)) }}
{{- if $a -}}
annotations:
  {{- toYaml $a | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The pod-level securityContext of every pod the chart renders (the relays and the
helm test pods): restricted, with the ids of podSecurityContext.
*/}}
{{- define "cdcrelay.podSecurityContext" -}}
runAsNonRoot: true
{{- range $k := list "runAsUser" "runAsGroup" "fsGroup" }}
{{- $id := index $.Values.podSecurityContext $k }}
{{- if not (or (kindIs "invalid" $id) (eq (toString $id) "")) }}
{{ $k }}: {{ int64 $id }}
{{- end }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The container securityContext of the relay, of the helm test's check, and of every
initContainer and sidecar that does not set its own: the restricted Pod Security
Standard and a read-only root filesystem.
*/}}
{{- define "cdcrelay.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
A list with one entry per key (the value of field "key" of each entry): an entry
with the key of an earlier one replaces it, in the earlier one's place, as for
extraEnv. Argument: dict "list" list "key" string. Renders YAML (fromYamlArray).
*/}}
{{- define "cdcrelay.lastByKey" -}}
{{- $by := dict }}
{{- range $e := .list }}
{{- $_ := set $by (toString (get $e $.key)) $e }}
{{- end }}
{{- $out := list }}
{{- $done := dict }}
{{- range $e := .list }}
{{- $k := toString (get $e $.key) }}
{{- if not (hasKey $done $k) }}
{{- $_ := set $done $k true }}
{{- $out = append $out (get $by $k) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
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
Seconds (a float) in a Go duration as time.ParseDuration reads it (the schema's
$defs/duration: ns, us, µs, ms, s, m, h parts, decimals allowed): "1m30s" -> 90,
"1.5m" -> 90, "2500ms" -> 2.5.
*/}}
{{- define "cdcrelay.seconds" -}}
{{- $d := toString . }}
{{- $part := "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)" }}
{{- if not (regexMatch (printf "^(%s)+$" $part) $d) }}
{{- fail (printf "cdcrelay: %q is not a duration such as 15s, 1m30s, 1.5h or 500ms" $d) }}
{{- end }}
{{- $unit := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "μs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 }}
{{- $total := 0.0 }}
{{- range $p := regexFindAll $part $d -1 }}
{{- $num := regexFind "^[0-9.]+" $p }}
{{- $total = addf $total (mulf (float64 $num) (get $unit (trimPrefix $num $p))) }}
{{- end }}
{{- /* rounded to microseconds, so float noise (0.1+0.2) does not add a second */}}
{{- round $total 6 }}
{{- end }}

{{/*
Whole seconds, rounded up, of cdcrelay.seconds: "1.5m" -> 90, "2500ms" -> 3.
*/}}
{{- define "cdcrelay.durationSeconds" -}}
{{- include "cdcrelay.seconds" . | float64 | ceil | int64 }}
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
{{- if has $k (list "extraEnv" "extraEnvFrom" "extraVolumes" "extraVolumeMounts" "initContainers" "sidecars") }}
{{- $_ := set $cfg $k (concat (default list (get $v.defaults $k)) (default list $val)) }}
{{- else if eq $k "columns" }}
{{- $_ := set $cfg "columns" (merge (deepCopy (default dict $val)) (deepCopy (default dict $v.defaults.columns))) }}
{{- else if eq $k "networkPolicy" }}
{{- /* key by key: a source's postgresql, broker or extraEgress replaces that of
defaults whole (so `to: []` or `ports: null` there mean what they say) */}}
{{- $np := deepCopy (default dict $v.defaults.networkPolicy) }}
{{- range $nk, $nv := default dict $val }}
{{- $_ := set $np $nk $nv }}
{{- end }}
{{- $_ := set $cfg "networkPolicy" $np }}
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
{{- with $src.replication }}
{{- if not .secretName }}
{{- fail (printf "cdcrelay: %s: replication.secretName is required (the Secret holding the standby's URL), or leave replication out" $where) }}
{{- end }}
{{- $rep := deepCopy . }}
{{- $_ := set $rep "key" (default "url" $rep.key) }}
{{- $_ := set $cfg "replication" $rep }}
{{- /* The relay refuses CDCRELAY_SLOT_FAILOVER=on with CDCRELAY_REPLICATION_URL:
PostgreSQL refuses failover for a slot created on a standby. */}}
{{- if eq (toString $cfg.slotFailover) "on" }}
{{- fail (printf "cdcrelay: %s: slotFailover \"on\" with replication (CDCRELAY_REPLICATION_URL): the slot is on a standby, and PostgreSQL refuses failover for a slot created on a standby; set slotFailover to auto, \"off\" or null" $where) }}
{{- end }}
{{- end }}
{{- $amqp := deepCopy (default dict $cfg.amqp) }}
{{- $_ := set $amqp "key" (default "url" $amqp.key) }}
{{- if not $amqp.secretName }}
{{- fail (printf "cdcrelay: %s: no AMQP Secret: set defaults.amqp.secretName, or amqp.secretName on the source" $where) }}
{{- end }}
{{- $_ := set $cfg "amqp" $amqp }}
{{- with $cfg.amqpTLS }}
{{- if not .secretName }}
{{- fail (printf "cdcrelay: %s: amqpTLS.secretName is required (the Secret holding the PEM files)" $where) }}
{{- end }}
{{- if not (or .ca .cert) }}
{{- fail (printf "cdcrelay: %s: amqpTLS names neither ca nor cert: set ca (the key holding the broker's CA) and/or cert and key" $where) }}
{{- end }}
{{- if ne (empty .cert) (empty .key) }}
{{- fail (printf "cdcrelay: %s: amqpTLS.cert and amqpTLS.key go together (the client certificate and its key)" $where) }}
{{- end }}
{{- end }}
{{- /* The relay refuses CDCRELAY_BACKOFF_MAX below CDCRELAY_BACKOFF_MIN (defaults 30s and 500ms). */}}
{{- $backoffMin := include "cdcrelay.seconds" (default "500ms" $cfg.backoffMin) | float64 }}
{{- $backoffMax := include "cdcrelay.seconds" (default "30s" $cfg.backoffMax) | float64 }}
{{- if lt $backoffMax $backoffMin }}
{{- fail (printf "cdcrelay: %s: backoffMax (%s) is below backoffMin (%s); the relay refuses it" $where (default "30s" $cfg.backoffMax) (default "500ms" $cfg.backoffMin)) }}
{{- end }}
{{- $stop := include "cdcrelay.durationSeconds" (default "15s" $cfg.shutdownTimeout) | atoi }}
{{- if kindIs "invalid" $cfg.terminationGracePeriodSeconds }}
{{- $_ := set $cfg "terminationGracePeriodSeconds" (add $stop 15) }}
{{- else if le (int64 $cfg.terminationGracePeriodSeconds) (int64 $stop) }}
{{- fail (printf "cdcrelay: %s: terminationGracePeriodSeconds (%s) must be above shutdownTimeout (%ds)" $where (include "cdcrelay.envString" $cfg.terminationGracePeriodSeconds) $stop) }}
{{- end }}
{{- /* poison stop makes the relay exit at a poison row, naming it, and park
nothing: a dead-letter exchange would never receive a copy. The settings may come
from values or from literal extraEnv entries (CDCRELAY_POISON when poison is null,
CDCRELAY_DEAD_LETTER_EXCHANGE when deadLetterExchange is null); the later wins. */}}
{{- $poison := toString (default "" $cfg.poison) }}
{{- $dlx := toString (default "" $cfg.deadLetterExchange) }}
{{- range $e := default list $cfg.extraEnv }}
{{- if and (eq $e.name "CDCRELAY_POISON") (hasKey $e "value") }}
{{- $poison = toString $e.value }}
{{- else if and (eq $e.name "CDCRELAY_DEAD_LETTER_EXCHANGE") (hasKey $e "value") }}
{{- $dlx = toString $e.value }}
{{- end }}
{{- end }}
{{- if and (eq $poison "stop") (ne $dlx "") }}
{{- fail (printf "cdcrelay: %s: poison \"stop\" with deadLetterExchange %q: with poison stop the relay exits at the first poison row (and at an unroutable one with unroutable: park) and parks nothing, so nothing would ever reach the dead-letter exchange. Set poison to park (or null: the relay's default, park) to dead-letter poison rows, or deadLetterExchange to null to stop at them" $where $dlx) }}
{{- end }}
{{- /* The lists that add containers and volumes to the pod: of two entries with
one name the later wins (volume mounts: one mountPath). An initContainer or sidecar
without a securityContext of its own gets the relay's restricted one. */}}
{{- $_ := set $cfg "extraVolumes" (include "cdcrelay.lastByKey" (dict "list" (concat (default list $v.extraVolumes) (default list $cfg.extraVolumes)) "key" "name") | fromYamlArray) }}
{{- $_ := set $cfg "extraVolumeMounts" (include "cdcrelay.lastByKey" (dict "list" (concat (default list $v.extraVolumeMounts) (default list $cfg.extraVolumeMounts)) "key" "mountPath") | fromYamlArray) }}
{{- range $ev := $cfg.extraVolumes }}
{{- if has (toString $ev.name) (list "tmp" "database-url" "replication-url" "amqp-url" "amqp-tls") }}
{{- fail (printf "cdcrelay: %s: extraVolumes %q: the chart uses that volume name itself (tmp, database-url, replication-url, amqp-url, amqp-tls); choose another" $where (toString $ev.name)) }}
{{- end }}
{{- end }}
{{- $sc := include "cdcrelay.containerSecurityContext" $root | fromYaml }}
{{- range $list := list "initContainers" "sidecars" }}
{{- $cs := list }}
{{- range $c := include "cdcrelay.lastByKey" (dict "list" (default list (get $cfg $list)) "key" "name") | fromYamlArray }}
{{- if has (toString $c.name) (list "relay" "check") }}
{{- fail (printf "cdcrelay: %s: %s %q: the chart names its own containers relay and check; choose another name" $where $list (toString $c.name)) }}
{{- end }}
{{- if not (hasKey $c "securityContext") }}
{{- $_ := set $c "securityContext" (deepCopy $sc) }}
{{- end }}
{{- $cs = append $cs $c }}
{{- end }}
{{- $_ := set $cfg $list $cs }}
{{- end }}
{{- $items = append $items $cfg }}
{{- end }}
{{- if and $v.monitoring.serviceMonitor.enabled (dig "podMonitor" "enabled" false $v.monitoring) }}
{{- fail "cdcrelay: monitoring.serviceMonitor and monitoring.podMonitor are both enabled: each relay would be scraped twice; enable one of them" }}
{{- end }}
{{- $_ := set .out "items" $items }}
{{- end }}

{{/*
Every variable the relay reads, without the CDCRELAY_ prefix, one per line: the env
tags of the Config fields in internal/config/config.go. extraEnv may name no other
CDCRELAY_ variable. internal/config/chart_test.go compares this list with the relay's,
so a variable added to the relay must be added here.
*/}}
{{- define "cdcrelay.relayVariables" -}}
DATABASE_URL
DATABASE_URL_FILE
REPLICATION_URL
REPLICATION_URL_FILE
AMQP_URL
AMQP_URL_FILE
AMQP_TLS_CA
AMQP_TLS_CERT
AMQP_TLS_KEY
AMQP_MANAGEMENT_URL
EXCHANGE
TABLE
PUBLICATION
SLOT
HTTP_ADDR
ID_COLUMN
ROUTING_KEY_COLUMN
PAYLOAD_COLUMN
HEADERS_COLUMN
EXCHANGE_COLUMN
TYPE_COLUMN
MAX_IN_FLIGHT
PUBLISH_CHANNELS
MAX_IN_FLIGHT_BYTES
CONFIRM_TIMEOUT
STATUS_INTERVAL
SHUTDOWN_TIMEOUT
BACKOFF_MIN
BACKOFF_MAX
AMQP_HEARTBEAT
MARK_INTERVAL
MARK_BATCH
RETENTION
RETENTION_INTERVAL
RETENTION_BATCH
MONITOR_INTERVAL
STANDBY_RETRY
SLOT_LOST
SLOT_FAILOVER
MARK_ORIGIN
LOCK_DATABASE
POISON
UNROUTABLE
DEAD_LETTER_EXCHANGE
MAX_MESSAGE_BYTES
LOG_LEVEL
LOG_FORMAT
{{- end }}

{{/*
Where the AMQP TLS Secret (amqpTLS) is mounted, and the file name of each of its keys.
*/}}
{{- define "cdcrelay.amqpTLSDir" -}}
/etc/cdcrelay/secrets/amqp-tls
{{- end }}

{{/*
The container's env list for one source. Argument: dict "root" $ "src" $src.
A variable is rendered only when its value is set: a null value leaves the relay's
own default in force. extraEnv may not name a CDCRELAY_ variable the relay does not
read (a typo would be silently ignored) nor one a chart value sets (two places for
one setting, and the one that wins would be a surprise).
*/}}
{{- define "cdcrelay.env" -}}
{{- $src := .src }}
{{- $where := ternary (printf "source %q" $src.name) "the source" (ne $src.name "") }}
{{- $env := list }}
{{- /* owner: variable name -> the value that sets it, for the extraEnv check. */}}
{{- $owner := dict }}
{{- /* The replication URL (a standby holds the slot) is optional; the chart owns
its variables all the same, so that it comes from a Secret like the others. */}}
{{- range $t := list (list "DATABASE" $src.database "database") (list "REPLICATION" $src.replication "replication") (list "AMQP" $src.amqp "amqp") }}
{{- $prefix := index $t 0 }}
{{- $ref := index $t 1 }}
{{- if not $ref }}
{{- else if $ref.mountAsFile }}
{{- $env = append $env (dict "name" (printf "CDCRELAY_%s_URL_FILE" $prefix) "value" (printf "/etc/cdcrelay/secrets/%s/url" (index $t 2))) }}
{{- else }}
{{- $env = append $env (dict "name" (printf "CDCRELAY_%s_URL" $prefix) "valueFrom" (dict "secretKeyRef" (dict "name" $ref.secretName "key" $ref.key))) }}
{{- end }}
{{- $_ := set $owner (printf "CDCRELAY_%s_URL" $prefix) (index $t 2) }}
{{- $_ := set $owner (printf "CDCRELAY_%s_URL_FILE" $prefix) (index $t 2) }}
{{- end }}
{{- $tls := default dict $src.amqpTLS }}
{{- range $t := list (list "CA" "ca") (list "CERT" "cert") (list "KEY" "key") }}
{{- if get $tls (index $t 1) }}
{{- $env = append $env (dict "name" (printf "CDCRELAY_AMQP_TLS_%s" (index $t 0)) "value" (printf "%s/%s.pem" (include "cdcrelay.amqpTLSDir" .) (index $t 1))) }}
{{- end }}
{{- if $tls }}
{{- $_ := set $owner (printf "CDCRELAY_AMQP_TLS_%s" (index $t 0)) "amqpTLS" }}
{{- end }}
{{- end }}
{{- with $src.amqpManagement }}
{{- $env = append $env (dict "name" "CDCRELAY_AMQP_MANAGEMENT_URL" "valueFrom" (dict "secretKeyRef" (dict "name" .secretName "key" (default "url" .key)))) }}
{{- $_ := set $owner "CDCRELAY_AMQP_MANAGEMENT_URL" "amqpManagement" }}
{{- end }}
{{- $plain := list
  (list "SLOT" $src.slot "slot")
  (list "PUBLICATION" $src.publication "publication")
  (list "HTTP_ADDR" ":8080" "")
  (list "EXCHANGE" $src.exchange "exchange")
  (list "TABLE" $src.table "table")
  (list "ID_COLUMN" $src.columns.id "columns.id")
  (list "ROUTING_KEY_COLUMN" $src.columns.routingKey "columns.routingKey")
  (list "PAYLOAD_COLUMN" $src.columns.payload "columns.payload")
  (list "HEADERS_COLUMN" $src.columns.headers "columns.headers")
  (list "EXCHANGE_COLUMN" $src.columns.exchange "columns.exchange")
  (list "TYPE_COLUMN" $src.columns.type "columns.type")
  (list "MAX_IN_FLIGHT" $src.maxInFlight "maxInFlight")
  (list "MAX_IN_FLIGHT_BYTES" $src.maxInFlightBytes "maxInFlightBytes")
  (list "PUBLISH_CHANNELS" $src.publishChannels "publishChannels")
  (list "CONFIRM_TIMEOUT" $src.confirmTimeout "confirmTimeout")
  (list "STATUS_INTERVAL" $src.statusInterval "statusInterval")
  (list "SHUTDOWN_TIMEOUT" $src.shutdownTimeout "shutdownTimeout")
  (list "BACKOFF_MIN" $src.backoffMin "backoffMin")
  (list "BACKOFF_MAX" $src.backoffMax "backoffMax")
  (list "AMQP_HEARTBEAT" $src.amqpHeartbeat "amqpHeartbeat")
  (list "POISON" $src.poison "poison")
  (list "UNROUTABLE" $src.unroutable "unroutable")
  (list "DEAD_LETTER_EXCHANGE" $src.deadLetterExchange "deadLetterExchange")
  (list "MAX_MESSAGE_BYTES" $src.maxMessageBytes "maxMessageBytes")
  (list "SLOT_LOST" $src.slotLost "slotLost")
  (list "SLOT_FAILOVER" $src.slotFailover "slotFailover")
  (list "MARK_ORIGIN" $src.markOrigin "markOrigin")
  (list "MARK_INTERVAL" $src.markInterval "markInterval")
  (list "MARK_BATCH" $src.markBatch "markBatch")
  (list "RETENTION" $src.retention "retention")
  (list "RETENTION_INTERVAL" $src.retentionInterval "retentionInterval")
  (list "RETENTION_BATCH" $src.retentionBatch "retentionBatch")
  (list "MONITOR_INTERVAL" $src.monitorInterval "monitorInterval")
  (list "LOG_LEVEL" $src.logLevel "logLevel")
  (list "LOG_FORMAT" $src.logFormat "logFormat")
}}
{{- range $p := $plain }}
{{- $val := index $p 1 }}
{{- if not (or (kindIs "invalid" $val) (eq (toString $val) "")) }}
{{- $name := printf "CDCRELAY_%s" (index $p 0) }}
{{- $env = append $env (dict "name" $name "value" (include "cdcrelay.envString" $val)) }}
{{- $_ := set $owner $name (index $p 2) }}
{{- end }}
{{- end }}
{{- /* extraEnv (defaults' entries, then the source's): of two entries with one
name the later wins. */}}
{{- $extra := default list $src.extraEnv }}
{{- $known := splitList "\n" (include "cdcrelay.relayVariables" .root) }}
{{- range $e := $extra }}
{{- if hasPrefix "CDCRELAY_" $e.name }}
{{- if not (has (trimPrefix "CDCRELAY_" $e.name) $known) }}
{{- fail (printf "cdcrelay: %s: extraEnv %s is not a variable the relay reads (misspelt?). It reads CDCRELAY_ followed by one of: %s" $where $e.name (join ", " $known)) }}
{{- else if eq $e.name "CDCRELAY_HTTP_ADDR" }}
{{- fail (printf "cdcrelay: %s: extraEnv CDCRELAY_HTTP_ADDR is fixed by the chart to :8080 (the container port, probes and Service use it)" $where) }}
{{- else if hasKey $owner $e.name }}
{{- $key := get $owner $e.name }}
{{- $null := ternary "" ", or set it to null to leave the variable to extraEnv" (has $key (list "database" "replication" "amqp" "slot" "publication" "amqpTLS")) }}
{{- fail (printf "cdcrelay: %s: extraEnv %s is already set by the chart value `%s`: set `%s` (in defaults or on the source) instead%s" $where $e.name $key $key $null) }}
{{- end }}
{{- end }}
{{- end }}
{{- $extraByName := dict }}
{{- range $e := $extra }}
{{- $_ := set $extraByName $e.name $e }}
{{- end }}
{{- $out := $env }}
{{- $done := dict }}
{{- range $e := $extra }}
{{- if not (hasKey $done $e.name) }}
{{- $_ := set $done $e.name true }}
{{- $out = append $out (get $extraByName $e.name) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
The volume mounts of the container that runs the relay (run, or check in the helm
test): /tmp, the Secrets mounted as files, then the extra mounts. A list, at column
0. Argument: dict "root" $ "src" $src.
*/}}
{{- define "cdcrelay.volumeMounts" -}}
{{- $src := .src -}}
- name: tmp
  mountPath: /tmp
{{- if $src.database.mountAsFile }}
- name: database-url
  mountPath: /etc/cdcrelay/secrets/database
  readOnly: true
{{- end }}
{{- with $src.replication }}
{{- if .mountAsFile }}
- name: replication-url
  mountPath: /etc/cdcrelay/secrets/replication
  readOnly: true
{{- end }}
{{- end }}
{{- if $src.amqp.mountAsFile }}
- name: amqp-url
  mountPath: /etc/cdcrelay/secrets/amqp
  readOnly: true
{{- end }}
{{- if $src.amqpTLS }}
- name: amqp-tls
  mountPath: {{ include "cdcrelay.amqpTLSDir" .root }}
  readOnly: true
{{- end }}
{{- with $src.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The volumes of a source's pods (the relays' and the helm test's): /tmp, the Secrets
mounted as files, then the extra volumes. A list, at column 0. Argument: dict "root"
$ "src" $src.
*/}}
{{- define "cdcrelay.volumes" -}}
{{- $src := .src -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if $src.database.mountAsFile }}
- name: database-url
  secret:
    secretName: {{ $src.database.secretName }}
    defaultMode: 0440
    items:
      - key: {{ $src.database.key }}
        path: url
{{- end }}
{{- with $src.replication }}
{{- if .mountAsFile }}
- name: replication-url
  secret:
    secretName: {{ .secretName }}
    defaultMode: 0440
    items:
      - key: {{ .key }}
        path: url
{{- end }}
{{- end }}
{{- if $src.amqp.mountAsFile }}
- name: amqp-url
  secret:
    secretName: {{ $src.amqp.secretName }}
    defaultMode: 0440
    items:
      - key: {{ $src.amqp.key }}
        path: url
{{- end }}
{{- with $src.amqpTLS }}
- name: amqp-tls
  secret:
    secretName: {{ .secretName }}
    defaultMode: 0440
    items:
      {{- range $k := list "ca" "cert" "key" }}
      {{- with get $src.amqpTLS $k }}
      - key: {{ . }}
        path: {{ $k }}.pem
      {{- end }}
      {{- end }}
{{- end }}
{{- with $src.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels of one source's pods of every kind (the relays and the helm test's
check): the NetworkPolicy selects these. The relays' selector adds
app.kubernetes.io/component: relay. Argument: dict "root" $ "src" $src.
*/}}
{{- define "cdcrelay.sourcePodLabels" -}}
app.kubernetes.io/name: {{ include "cdcrelay.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
cdcrelay.io/source: {{ .src.sourceLabel }}
{{- end }}

{{/*
The NetworkPolicy ports of one source's egress rule: "postgresql" or "broker".
Set ports are used as given; null ports are derived: PostgreSQL 5432; the broker
5671 (amqps) with amqpTLS, else 5672 and 5671 (the URL, in a Secret, may be either);
with amqpManagement, or a CDCRELAY_AMQP_MANAGEMENT_URL in extraEnv, also 15672 and 15671. A list of
NetworkPolicyPort, at column 0. Argument: dict "src" $src "what" string.
*/}}
{{- define "cdcrelay.egressPorts" -}}
{{- $np := default dict .src.networkPolicy }}
{{- $cfg := default dict (get $np .what) }}
{{- $ports := $cfg.ports }}
{{- if kindIs "invalid" $ports }}
{{- if eq .what "postgresql" }}
{{- $ports = list 5432 }}
{{- else if .src.amqpTLS }}
{{- $ports = list 5671 }}
{{- else }}
{{- $ports = list 5672 5671 }}
{{- end }}
{{- if eq .what "broker" }}
{{- $management := not (empty .src.amqpManagement) }}
{{- range $e := default list .src.extraEnv }}
{{- if eq $e.name "CDCRELAY_AMQP_MANAGEMENT_URL" }}
{{- $management = true }}
{{- end }}
{{- end }}
{{- if $management }}
{{- $ports = concat $ports (list 15672 15671) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $p := uniq $ports }}
- port: {{ int64 $p }}
  protocol: TCP
{{- end }}
{{- end }}
