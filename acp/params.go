package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// fields is a request's params object, decoded field by field so that an
// error can name the field that is missing or has the wrong type.
type fields struct {
	path string // prefix for nested objects, e.g. "env[2]."
	m    map[string]json.RawMessage
	// charge counts what building an array takes against the budget of
	// the request, before it is built (nil: not counted).
	charge func(n int) error
}

// Bounds on what a peer can make sandboxd build from one request: the
// bytes alone do not bound it, as a 4 MiB array of 1.4 million empty
// strings grows to some 130 MB once built.
const (
	// maxMembers bounds the members of a request and of its params:
	// ACP's have a handful.
	maxMembers = 256
	// maxItems bounds an array of a request: a command may be given
	// at most 2 MiB in execve (Linux's ARG_MAX), of which every
	// argument or variable takes at least 9 bytes (sandbox.Command.Check).
	maxItems = 2 << 20 / 9
	// itemCost bounds what one item costs once built, besides its
	// bytes: its slot in the slice and the pointers and string headers
	// decoding it makes.
	itemCost = 64
)

func decodeFields(raw json.RawMessage, path string) (fields, error) {
	name := strings.TrimSuffix(path, ".") + orParams(path)
	if len(raw) == 0 || string(raw) == "null" {
		return fields{}, invalidParams("%s: params must be an object", name)
	}
	if !json.Valid(raw) {
		return fields{}, invalidParams("%s: must be an object", name)
	}
	m, err := memberMap(raw)
	if errors.Is(err, errTooMany) {
		return fields{}, invalidParams("%s: more than %d members", name, maxMembers)
	}
	if err != nil {
		return fields{}, invalidParams("%s: must be an object", name)
	}
	return fields{path: path, m: m}, nil
}

// decodeParams is decodeFields for the params of a request whose arrays
// are counted against its budget (charge) before they are built.
func decodeParams(ctx context.Context, raw json.RawMessage) (fields, error) {
	f, err := decodeFields(raw, "")
	f.charge = func(n int) error { return charge(ctx, n) }
	return f, err
}

// errTooMany is memberMap's answer for an object of more than
// maxMembers members.
var errTooMany = errors.New("too many members")

// memberMap returns the members of the JSON object raw by their names,
// the last of a repeat, as encoding/json reads an object into a map; the
// values are raw's own bytes. It fails for what is no object, and for an
// object of more than maxMembers members, before it builds anything.
func memberMap(raw []byte) (map[string]json.RawMessage, error) {
	if i := skipSpace(raw, 0); i >= len(raw) || raw[i] != '{' {
		return nil, errNotContainer
	}
	n, err := countJSON(raw, maxMembers)
	if err != nil {
		return nil, err
	}
	if n > maxMembers {
		return nil, errTooMany
	}
	m := make(map[string]json.RawMessage, n)
	err = splitJSON(raw, func(name, value []byte) error {
		m[memberName(name)] = value
		return nil
	})
	return m, err
}

// array returns the raw value of field name when it is an array, with
// the number of its items; a value of another kind is nil. An array of
// more than maxItems items is refused, and the cost of building the rest
// is charged, before anything is built.
func (f fields) array(name string) (json.RawMessage, int, error) {
	raw := f.m[name]
	if i := skipSpace(raw, 0); i >= len(raw) || raw[i] != '[' {
		return nil, 0, nil
	}
	n, err := countJSON(raw, maxItems)
	if err != nil {
		return nil, 0, nil
	}
	if n > maxItems {
		return nil, 0, invalidParams("%s%s: more than %d items, more than a command can be given", f.path, name, maxItems)
	}
	if f.charge != nil {
		if err := f.charge(n*itemCost + len(raw)); err != nil {
			return nil, 0, err
		}
	}
	return raw, n, nil
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
	if _, isArray := any(dst).(*[]string); isArray {
		// Counted before it is built.
		if _, _, err := f.array(name); err != nil {
			return err
		}
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
// what the peer sent), and its error is the answer. The array is counted
// before anything is built from it (fields.array).
func items[T any](f fields, name string, check func(field string, v T) error) ([]T, error) {
	raw, n, err := f.array(name)
	if raw == nil || err != nil {
		return nil, err
	}
	out := make([]T, 0, n)
	i := -1
	err = splitJSON(raw, func(_, r []byte) error {
		i++
		var v T
		// null decodes into anything without an error, and is no item.
		if string(r) == "null" || json.Unmarshal(r, &v) != nil {
			return nil
		}
		// The name is made for an error only: the items may be many.
		if check != nil && check("", v) != nil {
			return check(fmt.Sprintf("%s%s[%d]", f.path, name, i), v)
		}
		out = append(out, v)
		return nil
	})
	if err != nil {
		return nil, err
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
