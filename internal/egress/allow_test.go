package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	for _, c := range []struct {
		in, want string
	}{
		{"api.anthropic.com", "api.anthropic.com:443"},
		{"API.Example.COM.:8443", "api.example.com:8443"},
		{"*.githubusercontent.com", "*.githubusercontent.com:443"},
		{"localhost:8080", "localhost:8080"},
		{"127.0.0.1:9", "127.0.0.1:9"},
		{"[::1]:80", "[::1]:80"},
		{"[2001:db8::1]", "[2001:db8::1]:443"},
		{"::ffff:10.0.0.1", ""},
	} {
		r, err := ParseRule(c.in)
		if c.want == "" {
			if err == nil {
				t.Errorf("ParseRule(%q) = %v, want an error", c.in, r)
			}
			continue
		}
		if err != nil || r.String() != c.want {
			t.Errorf("ParseRule(%q) = %v, %v; want %s", c.in, r, err, c.want)
		}
	}
	for _, bad := range []string{"", ":443", "host:", "host:0", "host:65536", "host:+1", "host:x", "a b", "http://x", "*.com", "*", "*.", "x..y", "[::1", "[::1]x", "[10.0.0.1]:1", "[fe80::1%eth0]:1", strings.Repeat("a", 64) + ".com", "a/b:1"} {
		if r, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) = %v, want an error", bad, r)
		} else if !strings.Contains(err.Error(), "HOST") && !strings.Contains(err.Error(), "port") && !strings.Contains(err.Error(), "host") && !strings.Contains(err.Error(), "address") && !strings.Contains(err.Error(), "wildcard") {
			t.Errorf("ParseRule(%q): %v says nothing of what is wanted", bad, err)
		}
	}
}

func TestAllowlistMatch(t *testing.T) {
	l, err := ParseAllowlist([]string{"api.example.com", "*.cdn.example.net:8443", "127.0.0.1:8080", "[::1]:8080", "localhost:9000"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host           string
		port           int
		allowed, exact bool
	}{
		{"api.example.com", 443, true, true},
		{"api.example.com", 80, false, false},
		{"x.api.example.com", 443, false, false},
		{"a.cdn.example.net", 8443, true, false},
		{"a.b.cdn.example.net", 8443, true, false},
		{"cdn.example.net", 8443, false, false},  // the suffix alone is not below itself
		{"xcdn.example.net", 8443, false, false}, // nor a name that merely ends the same
		{"a.cdn.example.net", 443, false, false},
		{"127.0.0.1", 8080, true, true},
		{"::1", 8080, true, true},
		{"127.0.0.2", 8080, false, false},
		{"localhost", 9000, true, true},
		{"localhost", 8080, false, false},
	} {
		addr, _ := netip.ParseAddr(c.host)
		allowed, exact := l.match(c.host, addr, c.port)
		if allowed != c.allowed || exact != c.exact {
			t.Errorf("match(%s:%d) = %v, %v; want %v, %v", c.host, c.port, allowed, exact, c.allowed, c.exact)
		}
	}
	// A wildcard never matches an address, even one whose text ends so.
	w, _ := ParseAllowlist([]string{"*.0.0.1:80"})
	if ok, _ := w.match("127.0.0.1", netip.MustParseAddr("127.0.0.1"), 80); ok {
		t.Error("a wildcard matched an IP address")
	}
}

func TestInternalAddresses(t *testing.T) {
	for _, c := range []struct {
		addr     string
		internal bool
	}{
		{"127.0.0.1", true}, {"127.8.9.10", true}, {"10.1.2.3", true}, {"172.16.0.1", true}, {"172.31.255.255", true},
		{"192.168.1.1", true}, {"169.254.169.254", true}, {"100.64.0.1", true}, {"100.127.255.255", true}, {"0.0.0.0", true},
		{"224.0.0.1", true}, {"255.255.255.255", true}, {"::", true}, {"::1", true}, {"fe80::1", true}, {"fd00::1", true},
		{"ff02::1", true}, {"::ffff:127.0.0.1", true}, {"::ffff:10.0.0.1", true}, {"64:ff9b::7f00:1", true}, {"2002:7f00:1::", true},
		{"2001::1", true}, {"192.0.2.7", true}, {"198.51.100.7", true}, {"203.0.113.7", true},
		{"93.184.215.14", false}, {"172.32.0.1", false}, {"100.128.0.1", false}, {"8.8.8.8", false}, {"2606:4700::1111", false},
		{"64:ff9b::808:808", false}, {"::ffff:8.8.8.8", false},
	} {
		if got := internal(netip.MustParseAddr(c.addr)); got != c.internal {
			t.Errorf("internal(%s) = %v, want %v", c.addr, got, c.internal)
		}
	}
}
