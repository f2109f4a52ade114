package acp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// memberSpan is where one member of a JSON object lies in its bytes: its
// name from start, its value from valueStart to end.
type memberSpan struct {
	name                   string
	start, valueStart, end int
}

// objectMembers returns the spans of the members of the JSON object obj,
// in order, repeats included. Rewrites edit messages through these spans,
// so every byte they do not change reaches the peer as it was written.
func objectMembers(obj []byte) ([]memberSpan, error) {
	if i := skipSpace(obj, 0); i >= len(obj) || obj[i] != '{' || !json.Valid(obj) {
		return nil, fmt.Errorf("not a JSON object")
	}
	var spans []memberSpan
	err := splitJSON(obj, func(name, value []byte) error {
		// Where in obj: both are obj's own bytes.
		start, valueStart := cap(obj)-cap(name), cap(obj)-cap(value)
		spans = append(spans, memberSpan{name: memberName(name), start: start, valueStart: valueStart, end: valueStart + len(value)})
		return nil
	})
	return spans, err
}

// memberValue returns the raw value of the last member of obj named name,
// as encoding/json reads it into a map.
func memberValue(obj []byte, name string) (json.RawMessage, bool) {
	spans, err := objectMembers(obj)
	if err != nil {
		return nil, false
	}
	for i := len(spans) - 1; i >= 0; i-- {
		if spans[i].name == name {
			return obj[spans[i].valueStart:spans[i].end], true
		}
	}
	return nil, false
}

// setMember returns obj with value as the value of every member named
// name (of any case with fold: a parser that matches names regardless of
// case must read the new value too), or with that member added first
// when it has none. obj must be a JSON object.
func setMember(obj []byte, name string, value []byte, fold bool) ([]byte, error) {
	spans, err := objectMembers(obj)
	if err != nil {
		return nil, err
	}
	var out []byte
	last := 0
	for _, s := range spans {
		if s.name == name || fold && strings.EqualFold(s.name, name) {
			out = append(append(out, obj[last:s.valueStart]...), value...)
			last = s.end
		}
	}
	if last > 0 {
		return append(out, obj[last:]...), nil
	}
	key, err := json.Marshal(name)
	if err != nil {
		return nil, err
	}
	at := bytes.IndexByte(obj, '{') + 1
	out = append(append(append(append(out, obj[:at]...), key...), ':'), value...)
	if len(spans) > 0 {
		out = append(out, ',')
	}
	return append(out, obj[at:]...), nil
}

// deleteMember returns obj without the members named name (of any case
// with fold). The members kept keep the separators that came before them.
func deleteMember(obj []byte, name string, fold bool) ([]byte, error) {
	spans, err := objectMembers(obj)
	if err != nil {
		return nil, err
	}
	named := func(s memberSpan) bool { return s.name == name || fold && strings.EqualFold(s.name, name) }
	if !slices.ContainsFunc(spans, named) {
		return obj, nil
	}
	out := append([]byte(nil), obj[:spans[0].start]...)
	first := true
	for i, s := range spans {
		if named(s) {
			continue
		}
		if !first {
			out = append(out, obj[spans[i-1].end:s.start]...)
		}
		out = append(out, obj[s.start:s.end]...)
		first = false
	}
	return append(out, obj[spans[len(spans)-1].end:]...), nil
}

// errNotContainer is splitJSON's answer for a value that is neither an
// array nor an object; errMalformed for bytes that are not JSON.
var (
	errNotContainer = errors.New("not a JSON array or object")
	errMalformed    = errors.New("not JSON")
)

// splitJSON calls f with each element of the JSON array or object raw, in
// order, as subslices of raw, copying nothing: an object's members with
// their name as written (quoted, escapes and all), an array's items with
// a nil name. It stops at the first error of f and returns it. raw is to
// be valid JSON (json.Valid): bytes that are not get errMalformed, or
// are split wrong, never a panic.
func splitJSON(raw []byte, f func(name, value []byte) error) error {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' && raw[i] != '[' {
		return errNotContainer
	}
	object := raw[i] == '{'
	last := byte(']')
	if object {
		last = '}'
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == last {
		return nil
	}
	for {
		var name []byte
		if object {
			end := skipString(raw, i)
			if end < 0 {
				return errMalformed
			}
			name = raw[i:end]
			i = skipSpace(raw, end)
			if i >= len(raw) || raw[i] != ':' {
				return errMalformed
			}
			i = skipSpace(raw, i+1)
		}
		end := skipValue(raw, i)
		if end < 0 {
			return errMalformed
		}
		if err := f(name, raw[i:end]); err != nil {
			return err
		}
		i = skipSpace(raw, end)
		switch {
		case i < len(raw) && raw[i] == ',':
			i = skipSpace(raw, i+1)
		case i < len(raw) && raw[i] == last:
			return nil
		default:
			return errMalformed
		}
	}
}

func skipSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\r' || raw[i] == '\n') {
		i++
	}
	return i
}

// skipString returns where the string that starts at raw[i] ends (after
// its closing quote), or -1.
func skipString(raw []byte, i int) int {
	if i >= len(raw) || raw[i] != '"' {
		return -1
	}
	// Byte by byte: most strings of a long message are short, and a
	// search for the next quote or backslash costs more to set up.
	for j := i + 1; j < len(raw); j++ {
		switch raw[j] {
		case '\\':
			j++ // and the byte it escapes
		case '"':
			return j + 1
		}
	}
	return -1
}

// skipValue returns where the value that starts at raw[i] ends, or -1.
func skipValue(raw []byte, i int) int {
	if i >= len(raw) {
		return -1
	}
	switch raw[i] {
	case '"':
		return skipString(raw, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(raw); j++ {
			switch raw[j] {
			case '"':
				if j = skipString(raw, j); j < 0 {
					return -1
				}
				j-- // at the closing quote
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	// A number, true, false or null: up to what follows it.
	j := i
	for ; j < len(raw); j++ {
		if c := raw[j]; c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\r' || c == '\n' {
			break
		}
	}
	if j == i {
		return -1
	}
	return j
}

// memberName is a member's name as splitJSON gives it, unquoted as
// encoding/json reads it.
func memberName(quoted []byte) string {
	if bytes.IndexByte(quoted, '\\') < 0 && utf8.Valid(quoted) {
		return string(quoted[1 : len(quoted)-1])
	}
	var s string
	json.Unmarshal(quoted, &s) // a valid string: never fails
	return s
}

// countJSON returns how many elements the JSON array or object raw has,
// counting no further than max+1.
func countJSON(raw []byte, max int) (int, error) {
	n := 0
	err := splitJSON(raw, func(_, _ []byte) error {
		if n++; n > max {
			return errStop
		}
		return nil
	})
	if errors.Is(err, errStop) {
		err = nil
	}
	return n, err
}

var errStop = errors.New("stop")
