package acp

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// fields is a request's params object, decoded field by field so that an
// error can name the field that is missing or has the wrong type.
type fields struct {
	path string // prefix for nested objects, e.g. "env[2]."
	m    map[string]json.RawMessage
}

func decodeFields(raw json.RawMessage, path string) (fields, error) {
	var m map[string]json.RawMessage
	if len(raw) == 0 || string(raw) == "null" {
		return fields{}, invalidParams("%s: params must be an object", strings.TrimSuffix(path, ".")+orParams(path))
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return fields{}, invalidParams("%s: must be an object", strings.TrimSuffix(path, ".")+orParams(path))
	}
	return fields{path: path, m: m}, nil
}

func orParams(path string) string {
	if path == "" {
		return "params"
	}
	return ""
}

// present reports whether the field is there and not null.
func (f fields) present(name string) bool {
	v, ok := f.m[name]
	return ok && string(v) != "null"
}

// get decodes field name into dst. A missing or null optional field leaves
// dst alone.
func get[T any](f fields, name string, required bool, dst *T) error {
	if !f.present(name) {
		if required {
			return invalidParams("%s%s: required", f.path, name)
		}
		return nil
	}
	if err := json.Unmarshal(f.m[name], dst); err != nil {
		return invalidParams("%s%s: must be %s", f.path, name, typeName(dst))
	}
	if s, ok := any(*dst).(string); ok {
		if err := checkText(f.path+name, s); err != nil {
			return err
		}
		// An id names containers, labels and log lines.
		if (name == "sessionId" || name == "terminalId") && len(s) > maxIDLen {
			return invalidParams("%s%s: %d bytes is longer than the %d an id may have", f.path, name, len(s), maxIDLen)
		}
	}
	return nil
}

// maxIDLen bounds a session or terminal id a peer sends. The schema sets
// none; agents' ids are UUIDs and the like, and one this long is already
// more than a log line should carry.
const maxIDLen = 4096

// items decodes an array field whose schema has
// x-deserialize-default-on-error and x-deserialize-skip-invalid-items, as
// the reference SDK reads it: a value that is not an array counts as
// absent, and an item that does not decode as T is left out. check, when
// not nil, sees each item kept with its name (name[i], i its place in
// what the peer sent), and its error is the answer.
func items[T any](f fields, name string, check func(field string, v T) error) ([]T, error) {
	var raw []json.RawMessage
	if !f.present(name) || json.Unmarshal(f.m[name], &raw) != nil {
		return nil, nil
	}
	out := make([]T, 0, len(raw))
	for i, r := range raw {
		var v T
		// null decodes into anything without an error, and is no item.
		if string(r) == "null" || json.Unmarshal(r, &v) != nil {
			continue
		}
		if check != nil {
			if err := check(fmt.Sprintf("%s%s[%d]", f.path, name, i), v); err != nil {
				return nil, err
			}
		}
		out = append(out, v)
	}
	return out, nil
}

// lenient decodes a field whose schema has x-deserialize-default-on-error:
// a value of the wrong type leaves dst alone, as if it were absent. A
// string is still checked by checkText: the value is there, and bad.
func lenient[T any](f fields, name string, dst *T) error {
	var v T
	if !f.present(name) || json.Unmarshal(f.m[name], &v) != nil {
		return nil
	}
	if s, ok := any(v).(string); ok {
		if err := checkText(f.path+name, s); err != nil {
			return err
		}
	}
	*dst = v
	return nil
}

// checkText rejects strings a process cannot take: NUL bytes. Invalid UTF-8
// never reaches here: encoding/json replaces it.
func checkText(field, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return invalidParams("%s: contains a NUL byte", field)
	}
	if !utf8.ValidString(s) {
		return invalidParams("%s: is not valid UTF-8", field)
	}
	return nil
}

func typeName(v any) string {
	switch v.(type) {
	case *string:
		return "a string"
	case *int64, *int:
		return "a non-negative integer"
	case *float64:
		return "a number"
	case *bool:
		return "a boolean"
	case *[]string:
		return "an array of strings"
	case *[]json.RawMessage:
		return "an array"
	}
	return fmt.Sprintf("%T", v)
}

// scalarText reads a field that may be written as a string ("1.5",
// "512MiB") or a number (1.5, 256), the way sandbox.toml takes it.
func scalarText(f fields, name string) (string, bool, error) {
	if !f.present(name) {
		return "", false, nil
	}
	raw := f.m[name]
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true, checkText(f.path+name, s)
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		return n.String(), true, nil
	}
	return "", false, invalidParams("%s%s: must be a string or a number", f.path, name)
}
