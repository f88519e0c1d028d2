{{/* Chart name, truncated to a DNS label. */}}
{{- define "openshell.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name prefix of every resource. Kept to 40 characters so that
suffixed names (-server-tls, -sandbox, -pki-hook) stay valid DNS labels. */}}
{{- define "openshell.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "openshell.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "openshell.selectorLabels" -}}
app.kubernetes.io/name: {{ include "openshell.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "openshell.labels" -}}
helm.sh/chart: {{ include "openshell.chart" . }}
{{ include "openshell.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "openshell.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "openshell.serviceAccountName" -}}
{{- default (include "openshell.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "openshell.sandboxServiceAccountName" -}}
{{- default (printf "%s-sandbox" (include "openshell.fullname" .)) .Values.server.drivers.kubernetes.serviceAccountName -}}
{{- end -}}

{{- define "openshell.sandboxNamespace" -}}
{{- default .Release.Namespace .Values.server.drivers.kubernetes.sandboxNamespace -}}
{{- end -}}

{{- define "openshell.gatewayId" -}}
{{- default (include "openshell.fullname" .) .Values.server.gatewayId -}}
{{- end -}}

{{- define "openshell.serverSecretName" -}}
{{- default (printf "%s-server-tls" (include "openshell.fullname" .)) .Values.pki.serverSecretName -}}
{{- end -}}

{{- define "openshell.clientSecretName" -}}
{{- default (printf "%s-client-tls" (include "openshell.fullname" .)) .Values.pki.clientSecretName -}}
{{- end -}}

{{- define "openshell.jwtSecretName" -}}
{{- default (printf "%s-jwt" (include "openshell.fullname" .)) .Values.pki.jwtSecretName -}}
{{- end -}}

{{- define "openshell.kekSecretName" -}}
{{- default (printf "%s-credentials-kek" (include "openshell.fullname" .)) .Values.server.credentialsKEK.secretName -}}
{{- end -}}

{{- define "openshell.supervisorImage" -}}
{{- default (printf "openshell-sandbox:%s" .Chart.AppVersion) .Values.server.drivers.kubernetes.supervisorImage -}}
{{- end -}}

{{/* In-cluster DNS names of the gateway Service. */}}
{{- define "openshell.serviceHosts" -}}
{{- $svc := include "openshell.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | join "," -}}
{{- end -}}

{{- define "openshell.gatewayEndpoint" -}}
{{- if .Values.server.drivers.kubernetes.gatewayEndpoint -}}
{{- .Values.server.drivers.kubernetes.gatewayEndpoint -}}
{{- else -}}
{{- printf "%s://%s.%s.svc:%v" (ternary "http" "https" .Values.server.disableTLS) (include "openshell.fullname" .) .Release.Namespace .Values.service.port -}}
{{- end -}}
{{- end -}}

{{/* Whether the gateway stores state in an external database. */}}
{{- define "openshell.externalDB" -}}
{{- if or .Values.server.database.existingSecret .Values.server.database.url -}}true{{- end -}}
{{- end -}}

{{/* TOML string array of ServiceAccount names for the driver table key named
by the first element; fails the render on a blank or non-string entry.
Usage: include "openshell.tomlNameList" (list "selectableServiceAccountNames" .Values.server.drivers.kubernetes.selectableServiceAccountNames) */}}
{{- define "openshell.tomlNameList" -}}
{{- $key := index . 0 -}}
{{- $names := index . 1 -}}
{{- $msg := printf "server.drivers.kubernetes.%s entries must be non-empty strings" $key -}}
{{- if not (kindIs "slice" $names) -}}
{{- fail (printf "server.drivers.kubernetes.%s must be a list; %s" $key $msg) -}}
{{- end -}}
{{- $out := list -}}
{{- range $names -}}
{{- if not (kindIs "string" .) -}}
{{- fail $msg -}}
{{- end -}}
{{- if eq (trim .) "" -}}
{{- fail $msg -}}
{{- end -}}
{{- $out = append $out (toJson .) -}}
{{- end -}}
[{{ join ", " $out }}]
{{- end -}}

{{/* TOML string array of a list of non-empty strings. */}}
{{- define "openshell.tomlList" -}}
{{- $out := list -}}
{{- range . -}}
{{- $out = append $out (toJson (toString .)) -}}
{{- end -}}
[{{ join ", " $out }}]
{{- end -}}

{{/* Fails the render on an unusable combination of values. */}}
{{- define "openshell.validate" -}}
{{- $k := .Values.server.drivers.kubernetes -}}
{{- if not (has $k.workspaceMode (list "shared" "managed" "operator")) -}}
{{- fail (printf "server.drivers.kubernetes.workspaceMode %q is not one of shared, managed, operator" (toString $k.workspaceMode)) -}}
{{- end -}}
{{- if and (eq $k.workspaceMode "operator") (empty $k.allowedNamespaces) -}}
{{- fail "server.drivers.kubernetes.allowedNamespaces must list at least one namespace in operator workspace mode" -}}
{{- end -}}
{{- if not (kindIs "bool" .Values.server.auth.allowUnauthenticatedUsers) -}}
{{- fail (printf "server.auth.allowUnauthenticatedUsers must be true or false, not %q" (toString .Values.server.auth.allowUnauthenticatedUsers)) -}}
{{- end -}}
{{- if not (kindIs "bool" $k.allowAdoption) -}}
{{- fail (printf "server.drivers.kubernetes.allowAdoption must be true or false, not %q" (toString $k.allowAdoption)) -}}
{{- end -}}
{{- $kek := .Values.server.credentialsKEK -}}
{{- if not (and (kindIs "bool" $kek.secret) (kindIs "bool" $kek.createSecret)) -}}
{{- fail "server.credentialsKEK.secret and server.credentialsKEK.createSecret must be true or false" -}}
{{- end -}}
{{- if and $kek.secret (empty $kek.secretKey) -}}
{{- fail "server.credentialsKEK.secretKey must not be empty" -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not (include "openshell.externalDB" .)) -}}
{{- fail "replicaCount > 1 needs an external database (server.database.url or server.database.existingSecret); SQLite serves one replica" -}}
{{- end -}}
{{- end -}}

{{/* Namespaces the gateway manages sandboxes in, known at install time
(none in managed mode: namespaces are created on demand). */}}
{{- define "openshell.workspaceNamespaces" -}}
{{- $k := .Values.server.drivers.kubernetes -}}
{{- if eq $k.workspaceMode "shared" -}}
{{- include "openshell.sandboxNamespace" . -}}
{{- else if eq $k.workspaceMode "operator" -}}
{{- join "," $k.allowedNamespaces -}}
{{- end -}}
{{- end -}}

{{/* Rules of the gateway on sandboxes and their pods. */}}
{{- define "openshell.sandboxRules" -}}
- apiGroups: ["agents.x-k8s.io"]
  resources: ["sandboxes"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
{{- end -}}
