package acp

import (
	"bytes"
	"encoding/json"
)

// maxScannedID bounds the id memberScan keeps: no id a peer means is
// longer, and an over-long message must not be copied whole to find it.
const maxScannedID = 1024

// memberScan finds, in a JSON object it is fed piece by piece, the members
// that say what the message is: its id, and whether it has a method (a
// request) or a result or error (a response). Only the object's own
// members count, the last of a repeat, as a JSON-RPC library reads them.
// It keeps nothing else, so a message too long to read whole can still
// be answered whatever the order of its members.
type memberScan struct {
	depth            int
	inString, escape bool
	// expectKey says the next string at depth 1 is a member's name; key
	// holds the name being read (up to 64 bytes, raw), lastKey the last
	// one read, unescaped.
	expectKey, readingKey bool
	key                   []byte
	lastKey               string
	// value holds the raw value of an "id" being read; capturing says one
	// is, tooLong that it passed maxScannedID.
	capturing, tooLong bool
	value              []byte

	id                json.RawMessage
	request, response bool
	started, broken   bool
}

// Write feeds the scan the next piece of the message.
func (m *memberScan) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		// Inside a string nothing is kept: on to its next quote or
		// backslash at once (a long message is mostly long strings).
		if m.inString && !m.escape && !m.readingKey && !m.capturing {
			i := bytes.IndexAny(p, `"\`)
			if i < 0 {
				break
			}
			p = p[i:]
		}
		m.step(p[0])
		p = p[1:]
	}
	return n, nil
}

func (m *memberScan) step(c byte) {
	if m.broken {
		return
	}
	if !m.started {
		switch c {
		case ' ', '\t', '\r', '\n':
			return
		case '{':
			m.started, m.depth, m.expectKey = true, 1, true
		default:
			m.broken = true // no object
		}
		return
	}
	if m.depth == 0 {
		return // after the object
	}
	if m.capturing {
		m.keep(c)
	}
	if m.inString {
		switch {
		case m.escape:
			m.escape = false
		case c == '\\':
			m.escape = true
		case c == '"':
			m.inString = false
			if m.readingKey {
				m.readingKey = false
				m.nameRead()
			}
			return
		}
		if m.readingKey && len(m.key) < 64 {
			m.key = append(m.key, c)
		}
		return
	}
	switch c {
	case '"':
		m.inString = true
		if m.depth == 1 && m.expectKey {
			m.readingKey, m.expectKey, m.key = true, false, m.key[:0]
		}
	case '{', '[':
		m.depth++
	case '}', ']':
		if m.depth == 1 && m.capturing {
			m.value = m.value[:len(m.value)-1] // the object's own brace
			m.valueRead()
		}
		m.depth--
	case ':':
		if m.depth == 1 && m.lastKey == "id" {
			m.capturing, m.tooLong, m.value = true, false, m.value[:0]
		}
	case ',':
		if m.depth == 1 {
			if m.capturing {
				m.value = m.value[:len(m.value)-1]
				m.valueRead()
			}
			m.expectKey = true
		}
	}
}

func (m *memberScan) keep(c byte) {
	if len(m.value) > maxScannedID {
		m.tooLong = true
		return
	}
	m.value = append(m.value, c)
}

// nameRead takes the member name just read.
func (m *memberScan) nameRead() {
	var name string
	if json.Unmarshal(append(append([]byte{'"'}, m.key...), '"'), &name) != nil {
		name = ""
	}
	m.lastKey = name
	switch name {
	case "method":
		m.request = true
	case "result", "error":
		m.response = true
	}
}

// valueRead takes the id just read: kept when it is short and whole.
func (m *memberScan) valueRead() {
	m.capturing = false
	v := bytes.TrimSpace(m.value)
	m.id = nil
	if !m.tooLong && json.Valid(v) {
		m.id = json.RawMessage(bytes.Clone(v))
	}
}
