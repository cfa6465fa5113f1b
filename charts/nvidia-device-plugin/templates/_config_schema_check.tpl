{{- /*
The config schema applied to a string entry of config.map (from --set-file), which Helm's values
schema cannot reach: the entry is parsed with fromYaml and walked against the same schema
values.schema.json applies to object entries ($defs.nvdpConfig; templates get it from
_config_keys.tpl, generated from config-schema.json like values.schema.json), for the keywords it uses: $ref, type,
const, enum, minimum, maximum, minLength, pattern, minItems, uniqueItems, required, properties,
items, oneOf, anyOf, not. Unknown keys are checked by checkConfigKeys, with the loader's did-you-mean.

Call with (dict "at" "/config/map/<entry>" "value" <parsed> "schema" <schema> "root" <nvdpConfig>).
Output: the first problem, worded as Helm words it for an object entry ("at '<path>': <problem>"),
or nothing.
*/ -}}
{{- define "nvidia-device-plugin.schemaProblem" -}}
{{- $value := .value -}}
{{- $schema := .schema -}}
{{- $at := .at -}}
{{- $problem := "" -}}
{{- if hasKey $schema "$ref" -}}
{{- $target := $.root -}}
{{- range $part := splitList "/" (trimPrefix "#/$defs/nvdpConfig/" (get $schema "$ref")) -}}
{{- $target = get $target $part -}}
{{- end -}}
{{- $problem = include "nvidia-device-plugin.schemaProblem" (dict "at" $at "value" $value "schema" $target "root" $.root) -}}
{{- end -}}
{{- $kind := "null" -}}
{{- if kindIs "string" $value -}}{{- $kind = "string" -}}
{{- else if kindIs "bool" $value -}}{{- $kind = "boolean" -}}
{{- else if kindIs "map" $value -}}{{- $kind = "object" -}}
{{- else if kindIs "slice" $value -}}{{- $kind = "array" -}}
{{- else if or (kindIs "float64" $value) (kindIs "int" $value) (kindIs "int64" $value) -}}
{{- $kind = ternary "integer" "number" (eq (float64 $value) (floor $value)) -}}
{{- end -}}
{{- if and (not $problem) (hasKey $schema "type") -}}
{{- $wanted := get $schema "type" -}}
{{- $types := ternary (list $wanted) $wanted (kindIs "string" $wanted) -}}
{{- $matches := or (has $kind $types) (and (eq $kind "integer") (has "number" $types)) -}}
{{- if not $matches -}}
{{- $problem = printf "at '%s': got %s, want %s" $at $kind (join " or " $types) -}}
{{- end -}}
{{- end -}}
{{- if and (not $problem) (hasKey $schema "const") (ne (toJson $value) (toJson (get $schema "const"))) -}}
{{- $problem = printf "at '%s': value must be %s" $at (squote (get $schema "const")) -}}
{{- end -}}
{{- if and (not $problem) (hasKey $schema "enum") -}}
{{- $allowed := list -}}
{{- range $option := get $schema "enum" -}}{{- $allowed = append $allowed (toJson $option) -}}{{- end -}}
{{- if not (has (toJson $value) $allowed) -}}
{{- $quoted := list -}}
{{- range $option := get $schema "enum" -}}{{- $quoted = append $quoted (squote $option) -}}{{- end -}}
{{- $problem = printf "at '%s': value must be one of %s" $at (join ", " $quoted) -}}
{{- end -}}
{{- end -}}
{{- if and (not $problem) (or (eq $kind "integer") (eq $kind "number")) -}}
{{- if and (hasKey $schema "minimum") (lt (float64 $value) (float64 (get $schema "minimum"))) -}}
{{- $problem = printf "at '%s': minimum: got %s, want %s" $at (include "nvidia-device-plugin.schemaNumber" $value) (include "nvidia-device-plugin.schemaNumber" (get $schema "minimum")) -}}
{{- else if and (hasKey $schema "maximum") (gt (float64 $value) (float64 (get $schema "maximum"))) -}}
{{- $problem = printf "at '%s': maximum: got %s, want %s" $at (include "nvidia-device-plugin.schemaNumber" $value) (include "nvidia-device-plugin.schemaNumber" (get $schema "maximum")) -}}
{{- end -}}
{{- end -}}
{{- if and (not $problem) (eq $kind "string") -}}
{{- if and (hasKey $schema "minLength") (lt (len $value) (int (get $schema "minLength"))) -}}
{{- $problem = printf "at '%s': minLength: got %d, want %v" $at (len $value) (get $schema "minLength") -}}
{{- else if and (hasKey $schema "pattern") (not (regexMatch (get $schema "pattern") $value)) -}}
{{- $problem = printf "at '%s': '%s' does not match pattern '%s'" $at $value (replace "\\" "\\\\" (get $schema "pattern")) -}}
{{- end -}}
{{- end -}}
{{- if and (not $problem) (eq $kind "array") -}}
{{- if and (hasKey $schema "minItems") (lt (len $value) (int (get $schema "minItems"))) -}}
{{- $problem = printf "at '%s': minItems: got %d, want %v" $at (len $value) (get $schema "minItems") -}}
{{- else if and (get $schema "uniqueItems") (ne (len $value) (len (uniq $value))) -}}
{{- $problem = printf "at '%s': items must be unique" $at -}}
{{- end -}}
{{- if and (not $problem) (hasKey $schema "items") -}}
{{- range $index, $item := $value -}}
{{- if not $problem -}}
{{- $problem = include "nvidia-device-plugin.schemaProblem" (dict "at" (printf "%s/%d" $at $index) "value" $item "schema" (get $schema "items") "root" $.root) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (not $problem) (eq $kind "object") -}}
{{- range $key := get $schema "required" | default list -}}
{{- if and (not $problem) (not (hasKey $value $key)) -}}
{{- $problem = printf "at '%s': missing property '%s'" $at $key -}}
{{- end -}}
{{- end -}}
{{- $properties := get $schema "properties" | default dict -}}
{{- range $key := keys $value | sortAlpha -}}
{{- if and (not $problem) (hasKey $properties $key) -}}
{{- $problem = include "nvidia-device-plugin.schemaProblem" (dict "at" (printf "%s/%s" $at $key) "value" (get $value $key) "schema" (get $properties $key) "root" $.root) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $keyword := list "oneOf" "anyOf" -}}
{{- if and (not $problem) (hasKey $schema $keyword) -}}
{{- $matched := 0 -}}
{{- range $branch := get $schema $keyword -}}
{{- if not (include "nvidia-device-plugin.schemaProblem" (dict "at" $at "value" $value "schema" $branch "root" $.root)) -}}
{{- $matched = add1 $matched -}}
{{- end -}}
{{- end -}}
{{- if or (eq $matched 0) (and (eq $keyword "oneOf") (gt $matched 1)) -}}
{{- $problem = printf "at '%s': '%s' failed, %s" $at $keyword (ternary "none matched" "more than one matched" (eq $matched 0)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (not $problem) (hasKey $schema "not") -}}
{{- if not (include "nvidia-device-plugin.schemaProblem" (dict "at" $at "value" $value "schema" (get $schema "not") "root" $.root)) -}}
{{- $problem = printf "at '%s': 'not' failed" $at -}}
{{- end -}}
{{- end -}}
{{- $problem -}}
{{- end -}}

{{- /* A number as Helm's schema errors print it: integers with thousands separators (1,024). */ -}}
{{- define "nvidia-device-plugin.schemaNumber" -}}
{{- if ne (float64 .) (floor .) -}}
{{- . -}}
{{- else -}}
{{- $n := int64 . -}}
{{- $rest := ternary (mul $n -1) $n (lt $n 0) -}}
{{- $groups := list -}}
{{- range until 7 -}}
{{- if ge $rest 1000 -}}
{{- $groups = prepend $groups (printf "%03d" (mod $rest 1000)) -}}
{{- $rest = div $rest 1000 -}}
{{- end -}}
{{- end -}}
{{- printf "%s%d" (ternary "-" "" (lt $n 0)) $rest -}}{{- range $groups -}},{{ . }}{{- end -}}
{{- end -}}
{{- end -}}
