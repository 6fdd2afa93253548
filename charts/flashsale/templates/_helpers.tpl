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
{{- end -}}

{{/* True ("true") when the connection settings are incomplete (no existing Secret, a value missing). */}}
{{- define "flashsale.connectionMissing" -}}
{{- $r := .Values.runtime -}}
{{- if and (not $r.existingSecret) (or (not $r.database.url) (and (not $r.redis.url) (not $r.redis.sentinels)) (not $r.kafka.brokers) (and (not $r.jwt.hs256Secret) (not $r.jwt.rs256PublicKey) (not $r.jwt.jwks))) -}}
true
{{- end -}}
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
