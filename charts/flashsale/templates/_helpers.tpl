{{/* Chart name, truncated to 63 characters (a DNS label). */}}
{{- define "flashsale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release>-<chart>, or <release> when it already contains the chart name. */}}
{{- define "flashsale.fullname" -}}
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

{{- define "flashsale.operatorName" -}}
{{- printf "%s-operator" (include "flashsale.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flashsale.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "flashsale.labels" -}}
helm.sh/chart: {{ include "flashsale.chart" . }}
app.kubernetes.io/name: {{ include "flashsale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flashsale
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of the operator pods (immutable once installed). */}}
{{- define "flashsale.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "flashsale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "flashsale.operatorLabels" -}}
{{ include "flashsale.labels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "flashsale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "flashsale.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag or repository@digest; the tag defaults to the chart's appVersion. */}}
{{- define "flashsale.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "flashsale.operatorImage" -}}
{{- include "flashsale.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{- define "flashsale.runtimeImage" -}}
{{- include "flashsale.imageRef" (dict "image" .Values.runtime.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{/* Base name of the Secrets: `<base>-<role>` per runtime role, `<base>-operator`, `<base>-migrations`. */}}
{{- define "flashsale.runtimeSecretName" -}}
{{- default .Values.runtime.secretName .Values.runtime.existingSecret -}}
{{- end -}}

{{/* Fails the render on contradictory values that JSON schema cannot express simply. */}}
{{- define "flashsale.validate" -}}
{{- $jwt := .Values.runtime.jwt -}}
{{- if gt (len (compact (list $jwt.hs256Secret $jwt.rs256PublicKey $jwt.jwks))) 1 -}}
{{- fail "runtime.jwt: set one of hs256Secret, rs256PublicKey and jwks, not both or more" -}}
{{- end -}}
{{- if and (not .Values.runtime.existingSecret) (or $jwt.hs256Secret $jwt.rs256PublicKey $jwt.jwks) $jwt.requireIssuerAudience (or (not $jwt.issuer) (not $jwt.audience)) -}}
{{- fail "runtime.jwt.issuer and runtime.jwt.audience are required: buyer tokens are checked against both (set runtime.jwt.requireIssuerAudience=false to accept any issuer and audience)" -}}
{{- end -}}
{{- $sasl := .Values.runtime.kafka.sasl -}}
{{- if and $sasl.mechanism (or (not $sasl.username) (not $sasl.password)) -}}
{{- fail "runtime.kafka.sasl: username and password are required with a mechanism" -}}
{{- end -}}
{{- if and (eq $sasl.mechanism "plain") (not .Values.runtime.kafka.tls.enabled) -}}
{{- fail "runtime.kafka.sasl.mechanism=plain sends the password in clear: set runtime.kafka.tls.enabled=true" -}}
{{- end -}}
{{- if and .Values.operator.watchAllNamespaces .Values.operator.watchNamespaces -}}
{{- fail "operator: set watchNamespaces or watchAllNamespaces, not both" -}}
{{- end -}}
{{- if and .Values.runtime.redis.sentinels (not .Values.runtime.redis.sentinelMaster) -}}
{{- fail "runtime.redis.sentinels needs runtime.redis.sentinelMaster (the master name the Sentinels monitor)" -}}
{{- end -}}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElection.enabled) -}}
{{- fail "operator.leaderElection.enabled=false needs operator.replicas=1: two active operators would drive the same sale twice" -}}
{{- end -}}
{{- if or (contains "\"secretKeyRef\"" (toJson .Values.runtime.extraEnv)) (contains "\"secret\"" (toJson .Values.runtime.extraVolumes)) -}}
{{- fail "runtime.extraEnv and runtime.extraVolumes may not reference Secrets: each runtime role reads only its own Secret; put secret values in runtime.extraSecretData.<role>" -}}
{{- end -}}
{{- with include "flashsale.missingConnection" . -}}
{{- fail (printf "runtime connection settings missing: %s. Set them (examples/values-small.yaml), or name Secrets you manage with runtime.existingSecret (docs/install.md, \"Connection settings\")" .) -}}
{{- end -}}
{{- include "flashsale.checkExistingSecret" . -}}
{{- end -}}

{{/* The missing connection values, comma-separated ("" when complete or runtime.existingSecret is set). */}}
{{- define "flashsale.missingConnection" -}}
{{- $r := .Values.runtime -}}
{{- $missing := list -}}
{{- if not $r.existingSecret -}}
{{- if not $r.database.url }}{{ $missing = append $missing "runtime.database.url (DATABASE_URL)" }}{{ end -}}
{{- if and (not $r.redis.url) (not $r.redis.sentinels) (not $r.redis.clusterNodes) }}{{ $missing = append $missing "runtime.redis.url (REDIS_URL), runtime.redis.sentinels or runtime.redis.clusterNodes" }}{{ end -}}
{{- if not $r.kafka.brokers }}{{ $missing = append $missing "runtime.kafka.brokers (KAFKA_BROKERS)" }}{{ end -}}
{{- if and (not $r.jwt.hs256Secret) (not $r.jwt.rs256PublicKey) (not $r.jwt.jwks) }}{{ $missing = append $missing "a buyer token key (runtime.jwt.hs256Secret, rs256PublicKey or jwks)" }}{{ end -}}
{{- end -}}
{{- join ", " $missing -}}
{{- end -}}

{{/*
With runtime.existingSecret: each Secret the release's pods read must exist with the keys its reader
needs (runtime/config.ts ROLE_NEEDS). Checked with `lookup` when Helm talks to the cluster (install,
upgrade, --dry-run=server); `helm template` and client-side dry runs cannot see the cluster (the
release namespace then reads as absent) and skip the check.
*/}}
{{- define "flashsale.checkExistingSecret" -}}
{{- $base := .Values.runtime.existingSecret -}}
{{- if and $base (lookup "v1" "Namespace" "" .Release.Namespace) -}}
{{- /* Redis by URL, Sentinels or Cluster seed nodes (core/redis.ts redisEnvIssue). */ -}}
{{- $redis := list "REDIS_URL|REDIS_SENTINELS|REDIS_CLUSTER_NODES" -}}
{{- $jwt := list "JWT_HS256_SECRET|JWT_RS256_PUBLIC_KEY|JWT_JWKS" -}}
{{- /* Buyer tokens are checked against both, as with the chart's own Secrets (flashsale.validate). */ -}}
{{- /* Not secret: runtime.extraEnv may set them instead (it reaches the api and after-sale pods too). */ -}}
{{- $extraEnv := list -}}
{{- range .Values.runtime.extraEnv }}{{ $extraEnv = append $extraEnv .name }}{{ end -}}
{{- if .Values.runtime.jwt.requireIssuerAudience -}}
{{- range $key := list "JWT_ISSUER" "JWT_AUDIENCE" }}{{ if not (has $key $extraEnv) }}{{ $jwt = append $jwt $key }}{{ end }}{{ end -}}
{{- end -}}
{{- $needs := dict "operator" (concat (list "DATABASE_URL" "KAFKA_BROKERS") $redis) -}}
{{- if .Values.migrations.enabled }}{{ $_ := set $needs "migrations" (list "DATABASE_URL") }}{{ end -}}
{{- /* The platform after-sale Deployment (templates/runtime/after-sale.yaml) answers buyers and
runs the settlement sweeper, refunds and order events: the api's token key and the consumer's
connections (ROLE_NEEDS "after-sale"). */ -}}
{{- if .Values.afterSale.enabled }}{{ $_ := set $needs "after-sale" (concat (list "DATABASE_URL" "KAFKA_BROKERS") $redis $jwt) }}{{ end -}}
{{- $roles := dict "api" (concat (list "DATABASE_URL") $redis $jwt) "relay" (concat (list "KAFKA_BROKERS") $redis) "consumer" (concat (list "DATABASE_URL" "KAFKA_BROKERS") $redis) -}}
{{- $checks := list -}}
{{- range $who, $keys := $needs }}{{ $checks = append $checks (list $.Release.Namespace $who $keys) }}{{ end -}}
{{- range $ns := include "flashsale.runtimeNamespaces" . | fromJsonArray -}}
{{- range $who, $keys := $roles }}{{ $checks = append $checks (list $ns $who $keys) }}{{ end -}}
{{- end -}}
{{- range $c := $checks -}}
{{- $ns := index $c 0 -}}
{{- $name := printf "%s-%s" $base (index $c 1) -}}
{{- $secret := lookup "v1" "Secret" $ns $name -}}
{{- if not $secret -}}
{{- fail (printf "runtime.existingSecret: Secret %s/%s not found (docs/install.md, \"Connection settings\")" $ns $name) -}}
{{- end -}}
{{- $data := default dict $secret.data -}}
{{- range $any := index $c 2 -}}
{{- $found := false -}}
{{- range $key := splitList "|" $any }}{{ if index $data $key }}{{ $found = true }}{{ end }}{{ end -}}
{{- if not $found -}}
{{- fail (printf "runtime.existingSecret: Secret %s/%s has no %s (its reader needs it; docs/install.md, \"Connection settings\")" $ns $name (splitList "|" $any | join " or ")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Comma-separated names of the runtime pods' imagePullSecrets (runtime.imagePullSecrets). */}}
{{- define "flashsale.runtimePullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.runtime.imagePullSecrets }}{{ $names = append $names .name }}{{ end -}}
{{- join "," $names -}}
{{- end -}}

{{/* Comma-separated names of imagePullSecrets. */}}
{{- define "flashsale.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets }}{{ $names = append $names .name }}{{ end -}}
{{- join "," $names -}}
{{- end -}}

{{/* Labels the operator puts on the runtime pods it creates (see operator/ in the repository). */}}
{{- define "flashsale.runtimePodSelectorLabels" -}}
app.kubernetes.io/name: flashsale-runtime
{{- end -}}

{{/* A map as `k=v, k=v` (sorted), for NOTES.txt. */}}
{{- define "flashsale.inlineMap" -}}
{{- $pairs := list -}}
{{- range $k, $v := . }}{{ $pairs = append $pairs (printf "%s=%v" $k $v) }}{{ end -}}
{{- join ", " $pairs -}}
{{- end -}}

{{/* The namespaces the operator watches (JSON list); [] when it watches every namespace. */}}
{{- define "flashsale.watchNamespaces" -}}
{{- if .Values.operator.watchAllNamespaces -}}
{{- list | toJson -}}
{{- else -}}
{{- default (list .Release.Namespace) .Values.operator.watchNamespaces | uniq | toJson -}}
{{- end -}}
{{- end -}}

{{/* Namespaces where runtime pods run (JSON list): the watched ones (the release's when every
namespace is watched) and runtime.secretNamespaces. Each gets the per-role Secrets and the
runtime NetworkPolicies. */}}
{{- define "flashsale.runtimeNamespaces" -}}
{{- $namespaces := include "flashsale.watchNamespaces" . | fromJsonArray -}}
{{- if not $namespaces }}{{ $namespaces = list .Release.Namespace }}{{ end -}}
{{- concat $namespaces .Values.runtime.secretNamespaces | uniq | toJson -}}
{{- end -}}

{{/*
The shared connection keys a runtime role reads (runtime/config.ts ROLE_NEEDS): the relay gets no
database URL, the api no Kafka brokers or Kafka credentials. Args: dict "shared" (all keys) "role".
*/}}
{{- define "flashsale.roleConnection" -}}
{{- $out := dict -}}
{{- range $k, $v := .shared -}}
{{- if and (eq $.role "relay") (eq $k "DATABASE_URL") -}}
{{- else if and (eq $.role "api") (hasPrefix "KAFKA_" $k) -}}
{{- else -}}{{- $_ := set $out $k $v -}}{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The TCP ports the NetworkPolicies let the operator, the runtime and the after-sale pods reach their
data stores on: networkPolicy.dataStorePorts, then every port the connection values name (the
PostgreSQL and Redis URLs, runtime.redis.sentinels and clusterNodes, runtime.kafka.brokers), so a
Sentinel on 26379 or brokers on a TLS port are not cut off by the default list. Ports the chart
cannot see (an existingSecret's URLs, the data nodes a Sentinel or a cluster announces) belong in
dataStorePorts. A JSON list.
*/}}
{{- define "flashsale.dataStorePorts" -}}
{{- $ports := list -}}
{{- range .Values.networkPolicy.dataStorePorts }}{{ $ports = append $ports (int .) }}{{ end -}}
{{- $r := .Values.runtime -}}
{{- $addresses := list -}}
{{- range (concat ($r.redis.sentinels | default list) ($r.redis.clusterNodes | default list) ($r.kafka.brokers | default list)) }}
{{- $addresses = append $addresses (toString .) -}}
{{- end -}}
{{- range (list $r.database.url $r.database.migrationUrl $r.redis.url) }}
{{- if . }}{{ $addresses = append $addresses (urlParse .).host }}{{ end -}}
{{- end -}}
{{- range $addresses }}
{{- $port := splitList ":" . | last -}}
{{- if and (contains ":" .) (regexMatch "^[0-9]+$" $port) }}{{ $ports = append $ports (int $port) }}{{ end -}}
{{- end -}}
{{- $ports | uniq | toJson -}}
{{- end -}}
