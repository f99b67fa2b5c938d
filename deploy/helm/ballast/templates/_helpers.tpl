{{/* Labels shared by every object of the release. */}}
{{- define "ballast.labels" -}}
app.kubernetes.io/part-of: ballast
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ballast.tokenSecret" -}}
{{- default (printf "%s-token" .Release.Name) .Values.existingSecret -}}
{{- end -}}

{{- define "ballast.sharedClaim" -}}
{{- if eq .Values.sharedStorage.type "existing" -}}
{{- required "sharedStorage.claimName is required with type existing" .Values.sharedStorage.claimName -}}
{{- else -}}
{{- printf "%s-shared" .Release.Name -}}
{{- end -}}
{{- end -}}

{{/* The shared storage volume, named "shared". */}}
{{- define "ballast.sharedVolume" -}}
- name: shared
{{- if eq .Values.sharedStorage.type "hostPath" }}
  hostPath:
    path: {{ .Values.sharedStorage.hostPath }}
    type: DirectoryOrCreate
{{- else }}
  persistentVolumeClaim:
    claimName: {{ include "ballast.sharedClaim" . }}
{{- end }}
{{- end -}}

{{- define "ballast.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "ballast.tokenEnv" -}}
- name: BALLAST_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "ballast.tokenSecret" . }}
      key: BALLAST_TOKEN
{{- end -}}

{{/* The store is PostgreSQL: an external URL, or the bundled server. */}}
{{- define "ballast.postgresStore" -}}
{{- if and .Values.postgresql.enabled (or .Values.store.url .Values.store.existingSecret) -}}
{{- fail "postgresql.enabled and store.url/store.existingSecret both name a store: pick one" -}}
{{- end -}}
{{- if or .Values.postgresql.enabled .Values.store.url .Values.store.existingSecret -}}
true
{{- end -}}
{{- end -}}

{{/* BALLAST_STORE (and the bundled server's PGPASSWORD) for ballastd; nothing with SQLite. */}}
{{- define "ballast.storeEnv" -}}
{{- $postgres := include "ballast.postgresStore" . -}}
{{- if .Values.postgresql.enabled }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Release.Name }}-postgresql
      key: password
- name: BALLAST_STORE
  value: {{ printf "postgresql://ballast@%s-postgresql:5432/ballast?sslmode=disable" .Release.Name | quote }}
{{- else if $postgres }}
- name: BALLAST_STORE
  valueFrom:
    secretKeyRef:
      name: {{ default (printf "%s-store" .Release.Name) .Values.store.existingSecret }}
      key: {{ if .Values.store.existingSecret }}{{ .Values.store.existingSecretKey }}{{ else }}url{{ end }}
{{- end }}
{{- end -}}
