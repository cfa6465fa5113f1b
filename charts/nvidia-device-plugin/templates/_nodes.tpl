{{/*
Which nodes the DaemonSets can run on, for NOTES.txt.

"nvidia-device-plugin.nodeMatch": "<matching> <total>" counted from the cluster's Node objects with
`lookup` (nodeSelector and the required node affinity, as the scheduler reads them; taints are left out),
or "" where the cluster cannot be asked (helm template, --dry-run, no permission to list nodes).
*/}}
{{- define "nvidia-device-plugin.nodeMatch" -}}
{{- $nodes := lookup "v1" "Node" "" "" -}}
{{- if and $nodes (hasKey $nodes "items") -}}
{{- $terms := list -}}
{{- with include "nvidia-device-plugin.gpuAffinity" . | fromYaml }}{{ with .nodeAffinity }}{{ with .requiredDuringSchedulingIgnoredDuringExecution }}{{ $terms = .nodeSelectorTerms | default list }}{{ end }}{{ end }}{{ end -}}
{{- $matching := 0 -}}
{{- range $node := $nodes.items -}}
{{- $labels := $node.metadata.labels | default dict -}}
{{- $ok := true -}}
{{- range $key, $value := ($.Values.nodeSelector | default dict) -}}
{{- if or (not (hasKey $labels $key)) (ne (toString (get $labels $key)) (toString $value)) }}{{ $ok = false }}{{ end -}}
{{- end -}}
{{- if and $ok $terms -}}
{{- $anyTerm := false -}}
{{- range $term := $terms -}}
{{- $all := false }}{{ if or $term.matchExpressions $term.matchFields }}{{ $all = true }}{{ end -}}
{{- range $expr := ($term.matchExpressions | default list) -}}
{{- $has := hasKey $labels $expr.key -}}
{{- $value := toString (get $labels $expr.key) -}}
{{- $values := $expr.values | default list -}}
{{- if eq $expr.operator "In" }}{{ if not (and $has (has $value $values)) }}{{ $all = false }}{{ end -}}
{{- else if eq $expr.operator "NotIn" }}{{ if and $has (has $value $values) }}{{ $all = false }}{{ end -}}
{{- else if eq $expr.operator "Exists" }}{{ if not $has }}{{ $all = false }}{{ end -}}
{{- else if eq $expr.operator "DoesNotExist" }}{{ if $has }}{{ $all = false }}{{ end -}}
{{- else if eq $expr.operator "Gt" }}{{ if not (and $has (gt (atoi $value) (atoi (first $values)))) }}{{ $all = false }}{{ end -}}
{{- else if eq $expr.operator "Lt" }}{{ if not (and $has (lt (atoi $value) (atoi (first $values)))) }}{{ $all = false }}{{ end -}}
{{- end -}}
{{- end -}}
{{- range $field := ($term.matchFields | default list) -}}
{{- $in := has $node.metadata.name ($field.values | default list) -}}
{{- if or (ne $field.key "metadata.name") (and (eq $field.operator "In") (not $in)) (and (eq $field.operator "NotIn") $in) }}{{ $all = false }}{{ end -}}
{{- end -}}
{{- if $all }}{{ $anyTerm = true }}{{ end -}}
{{- end -}}
{{- $ok = $anyTerm -}}
{{- end -}}
{{- if $ok }}{{ $matching = add1 $matching }}{{ end -}}
{{- end -}}
{{- printf "%d %d" $matching (len $nodes.items) -}}
{{- end -}}
{{- end -}}

{{/* The required node affinity as readable lines, one per alternative. */}}
{{- define "nvidia-device-plugin.affinityLines" -}}
{{- with .Values.affinity }}{{ with .nodeAffinity }}{{ with .requiredDuringSchedulingIgnoredDuringExecution }}
{{- range .nodeSelectorTerms }}
{{- $parts := list }}
{{- range concat (.matchExpressions | default list) (.matchFields | default list) }}
{{- $values := .values | default list }}
{{- if and (eq .operator "In") (eq (len $values) 1) }}{{ $parts = append $parts (printf "%s=%s" .key (first $values)) }}
{{- else if eq .operator "In" }}{{ $parts = append $parts (printf "%s in (%s)" .key (join ", " $values)) }}
{{- else if eq .operator "NotIn" }}{{ $parts = append $parts (printf "%s not in (%s)" .key (join ", " $values)) }}
{{- else if eq .operator "Exists" }}{{ $parts = append $parts (printf "label %s set" .key) }}
{{- else if eq .operator "DoesNotExist" }}{{ $parts = append $parts (printf "no label %s" .key) }}
{{- else }}{{ $parts = append $parts (printf "%s %s %s" .key .operator (join ", " $values)) }}
{{- end }}
{{- end }}
  - {{ join " and " $parts }}
{{- end }}
{{- end }}{{ end }}{{ end }}
{{- end -}}
