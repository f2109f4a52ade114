package sandbox

import (
	"bytes"
	"strings"
)

// gitConfigVar is one variable a git config file sets: section and key
// lower case, subsection as written.
type gitConfigVar struct {
	section, subsection, key string
	value                    string
	// valueless is a name with no "=", which git reads as true.
	valueless bool
}

// name is the variable's full name as git spells it, for messages.
func (v gitConfigVar) name() string {
	if v.subsection == "" {
		return v.section + "." + v.key
	}
	return v.section + "." + v.subsection + "." + v.key
}

// parseGitConfig returns the variables a git config file sets, in order,
// read as git reads them: sections `[name]`, `[name "subsection"]` and
// the old `[name.subsection]`, a variable after a header on its line,
// `#` and `;` comments, double quotes, the escapes \n \t \b \" \\, and a
// backslash that continues a value on the next line. git refuses a file
// with a line it cannot read, so nothing of it takes effect; here such a
// line is skipped and the rest read, so that nothing is missed where the
// two readings might differ.
func parseGitConfig(b []byte) []gitConfigVar {
	p := configParser{b: bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))}
	var vars []gitConfigVar
	var section, subsection string
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case isConfigSpace(c) || c == '\n':
			p.i++
		case c == '#' || c == ';':
			p.skipLine()
		case c == '[':
			s, sub, ok := p.header()
			if !ok {
				section, subsection = "", ""
				p.skipLine()
				continue
			}
			section, subsection = s, sub
		case isASCIILetter(c):
			key := p.name()
			value, valueless, ok := p.value()
			if !ok {
				p.skipLine()
				continue
			}
			if section != "" {
				vars = append(vars, gitConfigVar{section: section, subsection: subsection, key: key, value: value, valueless: valueless})
			}
		default:
			p.skipLine()
		}
	}
	return vars
}

// configParser is the state of parseGitConfig: the file and the place in
// it.
type configParser struct {
	b []byte
	i int
}

func (p *configParser) skipLine() {
	if n := bytes.IndexByte(p.b[p.i:], '\n'); n >= 0 {
		p.i += n + 1
		return
	}
	p.i = len(p.b)
}

// header reads a section header from its "[": the section lower case and
// the subsection, which keeps its case in the quoted form.
func (p *configParser) header() (section, subsection string, ok bool) {
	p.i++ // "["
	start := p.i
	for p.i < len(p.b) && (isASCIILetter(p.b[p.i]) || isDigit(p.b[p.i]) || p.b[p.i] == '-' || p.b[p.i] == '.') {
		p.i++
	}
	name := strings.ToLower(string(p.b[start:p.i]))
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		// The old form: everything after the first dot, lower case.
		s, sub, _ := strings.Cut(name, ".")
		return s, sub, s != ""
	}
	for p.i < len(p.b) && isConfigSpace(p.b[p.i]) {
		p.i++
	}
	if name == "" || p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", "", false
	}
	p.i++
	var sub strings.Builder
	for p.i < len(p.b) && p.b[p.i] != '"' {
		c := p.b[p.i]
		if c == '\n' {
			return "", "", false
		}
		// A backslash takes the next character as it is.
		if c == '\\' {
			if p.i++; p.i >= len(p.b) || p.b[p.i] == '\n' {
				return "", "", false
			}
			c = p.b[p.i]
		}
		sub.WriteByte(c)
		p.i++
	}
	if p.i+1 >= len(p.b) || p.b[p.i+1] != ']' {
		return "", "", false
	}
	p.i += 2
	return name, sub.String(), true
}

// name reads a variable's name: a letter, then letters, digits and "-".
func (p *configParser) name() string {
	start := p.i
	for p.i < len(p.b) && (isASCIILetter(p.b[p.i]) || isDigit(p.b[p.i]) || p.b[p.i] == '-') {
		p.i++
	}
	return strings.ToLower(string(p.b[start:p.i]))
}

// value reads what follows a variable's name to the end of its line: no
// "=" is a valueless variable, else the value as git unquotes it.
func (p *configParser) value() (value string, valueless, ok bool) {
	for p.i < len(p.b) && isConfigSpace(p.b[p.i]) {
		p.i++
	}
	if p.i >= len(p.b) || p.b[p.i] == '\n' {
		return "", true, true
	}
	if p.b[p.i] != '=' {
		return "", false, false
	}
	p.i++
	var v []byte
	quoted, comment := false, false
	spaces := 0 // blanks not yet known to be inside the value
	for ; p.i < len(p.b); p.i++ {
		c := p.b[p.i]
		if c == '\r' && p.i+1 < len(p.b) && p.b[p.i+1] == '\n' {
			continue
		}
		if c == '\n' {
			break
		}
		if comment {
			continue
		}
		if !quoted && isConfigSpace(c) {
			if len(v) > 0 {
				spaces++
			}
			continue
		}
		if !quoted && (c == '#' || c == ';') {
			comment = true
			continue
		}
		for ; spaces > 0; spaces-- {
			v = append(v, ' ')
		}
		switch c {
		case '"':
			quoted = !quoted
			continue
		case '\\':
			p.i++
			if p.i < len(p.b) && p.b[p.i] == '\r' && p.i+1 < len(p.b) && p.b[p.i+1] == '\n' {
				p.i++
			}
			if p.i >= len(p.b) {
				return "", false, false
			}
			switch p.b[p.i] {
			case '\n': // continued on the next line
				continue
			case 'n':
				c = '\n'
			case 't':
				c = '\t'
			case 'b':
				c = '\b'
			case '"', '\\':
				c = p.b[p.i]
			default:
				return "", false, false
			}
		}
		v = append(v, c)
	}
	if quoted {
		return "", false, false
	}
	return string(v), false, true
}

// isConfigSpace is a blank within a line as git's config reader sees one.
func isConfigSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'
}

func isASCIILetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// gitBool reports whether a value is one git reads as a boolean, which
// core.fsmonitor also takes in place of a command.
func gitBool(v gitConfigVar) bool {
	if v.valueless {
		return true
	}
	switch strings.ToLower(v.value) {
	case "", "true", "false", "yes", "no", "on", "off", "1", "0":
		return true
	}
	return false
}
