{{/* The labels every object carries: kustomize's part-of, and Helm's own. */}}
{{- define "localvol.labels" -}}
app.kubernetes.io/part-of: localvol
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "localvol.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* "true" when the localvol container needs the host's LVM directories. */}}
{{- define "localvol.lvmHost" -}}
{{- if eq (toString .Values.lvmHost) "auto" -}}
{{- $lvm := false -}}
{{- range .Values.deviceClasses -}}
{{- if or (eq .kind "lvm") (eq .kind "lvm-thin") (and (eq .kind "pmem") (eq (toString .mode) "lvm")) -}}
{{- $lvm = true -}}
{{- end -}}
{{- end -}}
{{- $lvm -}}
{{- else -}}
{{- .Values.lvmHost -}}
{{- end -}}
{{- end }}

{{/* The CSI socket's directory on the host. */}}
{{- define "localvol.socketDir" -}}
{{ .Values.kubeletRootDir }}/plugins/localvol.csi.dev
{{- end }}

{{/* Refusals the schema cannot express: each StorageClass names a device class of the
     file, and the file names each class once. */}}
{{- define "localvol.validate" -}}
{{- $names := list -}}
{{- range .Values.deviceClasses -}}
{{- if has .name $names -}}
{{- fail (printf "deviceClasses: %s is named twice" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- range .Values.storageClasses -}}
{{- if not (has .deviceClass $names) -}}
{{- fail (printf "storageClasses: %s names device class %s, which deviceClasses does not hold (%s)" .name .deviceClass (join ", " $names)) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "localvol.config" -}}
device-classes:
{{ toYaml .Values.deviceClasses }}
{{- with .Values.reclaim }}
reclaim:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end }}

{{/* A sidecar's securityContext: root for the root-owned 0600 socket, nothing more. */}}
{{- define "localvol.sidecarSecurity" -}}
securityContext:
  runAsUser: 0
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end }}

{{/* A binding of role NAME (a ClusterRole for a ClusterRoleBinding, else a Role in the
     release's namespace) to the service account SA (default localvol-node):
     include "localvol.binding" (list . KIND NAME [SA]). */}}
{{- define "localvol.binding" -}}
{{- $root := index . 0 -}}
{{- $kind := index . 1 -}}
{{- $name := index . 2 -}}
{{- $sa := "localvol-node" -}}
{{- if gt (len .) 3 }}{{ $sa = index . 3 }}{{ end -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ $kind }}
metadata:
  name: {{ $name }}
  {{- if eq $kind "RoleBinding" }}
  namespace: {{ $root.Release.Namespace }}
  {{- end }}
  labels:
    {{- include "localvol.labels" $root | nindent 4 }}
subjects:
  - kind: ServiceAccount
    name: {{ $sa }}
    namespace: {{ $root.Release.Namespace }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ if eq $kind "RoleBinding" }}Role{{ else }}ClusterRole{{ end }}
  name: {{ $name }}
{{- end }}
