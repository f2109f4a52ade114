package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// DefaultPort is the port of an allowlist entry that names none: HTTPS.
const DefaultPort = 443

// Rule is one allowlist entry: a host name, an IP address, or "*.suffix"
// (any name below suffix, not suffix itself), and one port.
type Rule struct {
	// Host is lower case, without a trailing dot; for a wildcard, the
	// suffix without "*.".
	Host     string
	Wildcard bool
	// Addr is set when Host is an IP address.
	Addr netip.Addr
	Port int
}

func (r Rule) String() string {
	h := r.Host
	switch {
	case r.Wildcard:
		h = "*." + h
	case r.Addr.Is6():
		h = "[" + h + "]"
	}
	return h + ":" + strconv.Itoa(r.Port)
}

// maxHostLen is the longest DNS name.
const maxHostLen = 253

// ParseRule reads an allowlist entry, HOST[:PORT], *.SUFFIX[:PORT] or
// [IPV6][:PORT]; the port is DefaultPort when not given.
func ParseRule(s string) (Rule, error) {
	host, port := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return Rule{}, fmt.Errorf("%.200q: want HOST[:PORT] (an IPv6 address as [ADDR]:PORT): no closing ]", s)
		}
		host, port = s[1:end], s[end+1:]
		if port != "" {
			if port[0] != ':' {
				return Rule{}, fmt.Errorf("%.200q: want HOST[:PORT]: %.50q follows the address", s, port)
			}
			port = port[1:]
			if port == "" {
				return Rule{}, fmt.Errorf("%.200q: want HOST[:PORT]: empty port", s)
			}
		}
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return Rule{}, fmt.Errorf("%.200q: %.100q in brackets is not an IPv6 address", s, host)
		}
	case strings.Count(s, ":") == 1:
		host, port, _ = strings.Cut(s, ":")
		if port == "" {
			return Rule{}, fmt.Errorf("%.200q: want HOST[:PORT]: empty port", s)
		}
	case strings.Count(s, ":") > 1:
		return Rule{}, fmt.Errorf("%.200q: want HOST[:PORT] (write an IPv6 address as [ADDR] or [ADDR]:PORT)", s)
	}
	r := Rule{Port: DefaultPort}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || port[0] == '+' {
			return Rule{}, fmt.Errorf("%.200q: port %.50q is not a number from 1 to 65535", s, port)
		}
		r.Port = n
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return Rule{}, fmt.Errorf("%.200q: an address with a zone cannot be allowed", s)
		}
		r.Addr, r.Host = a.Unmap(), a.Unmap().String()
		return r, nil
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.Wildcard, host = true, rest
	}
	name, err := hostName(host)
	if err != nil {
		return Rule{}, fmt.Errorf("%.200q: %w", s, err)
	}
	if r.Wildcard && !strings.Contains(name, ".") {
		// *.com would open a whole top-level domain.
		return Rule{}, fmt.Errorf("%.200q: a wildcard needs a suffix of two labels or more (*.example.com)", s)
	}
	r.Host = name
	return r, nil
}

// hostName checks a DNS name and returns it in lower case, without a
// trailing dot.
func hostName(h string) (string, error) {
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if h == "" {
		return "", errors.New("want HOST[:PORT]: empty host")
	}
	if len(h) > maxHostLen {
		return "", fmt.Errorf("host is longer than the %d bytes a DNS name has", maxHostLen)
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return "", fmt.Errorf("%.100q is not a host name (an empty label, or one over 63 bytes)", h)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("%.100q is not a host name (%q is no letter, digit, '-' or '_')", h, c)
			}
		}
	}
	return h, nil
}

// Allowlist is the destinations a contained agent may reach.
type Allowlist []Rule

// ParseAllowlist reads entries as ParseRule does.
func ParseAllowlist(entries []string) (Allowlist, error) {
	l := make(Allowlist, 0, len(entries))
	for _, e := range entries {
		r, err := ParseRule(e)
		if err != nil {
			return nil, err
		}
		l = append(l, r)
	}
	return l, nil
}

// match says whether host (as the request names it: a name or an IP
// address) and port are allowed, and whether by an entry that names them
// exactly, which alone lets a private or loopback address through.
func (l Allowlist) match(host string, addr netip.Addr, port int) (allowed, exact bool) {
	for _, r := range l {
		if r.Port != port {
			continue
		}
		switch {
		case addr.IsValid():
			if r.Addr == addr {
				return true, true
			}
		case r.Wildcard:
			if strings.HasSuffix(host, "."+r.Host) {
				allowed = true
			}
		case r.Host == host && !r.Addr.IsValid():
			return true, true
		}
	}
	return allowed, false
}
