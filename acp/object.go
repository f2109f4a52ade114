package acp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
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
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object")
	}
	var spans []memberSpan
	prev := int(dec.InputOffset())
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := tok.(string)
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, err
		}
		end := int(dec.InputOffset())
		// Between the last value (or the brace) and a name there is
		// only white space and a comma.
		start := prev + len(obj[prev:]) - len(bytes.TrimLeft(obj[prev:], " \t\r\n,"))
		spans = append(spans, memberSpan{name: name, start: start, valueStart: end - len(value), end: end})
		prev = end
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return spans, nil
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
