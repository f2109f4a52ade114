package egress

import (
	"fmt"
	"net"
	"net/netip"
)

// internalRanges are the addresses that lead to the host itself or to
// networks behind it rather than the internet: a name that resolves to one
// is refused unless listed exactly, so that a name pointed at 127.0.0.1 or
// a cloud's metadata service does not reach them.
var internalRanges = [...]netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // this network, unspecified
	netip.MustParsePrefix("10.0.0.0/8"),      // private
	netip.MustParsePrefix("100.64.0.0/10"),   // carrier-grade NAT
	netip.MustParsePrefix("127.0.0.0/8"),     // loopback
	netip.MustParsePrefix("169.254.0.0/16"),  // link-local, cloud metadata
	netip.MustParsePrefix("172.16.0.0/12"),   // private
	netip.MustParsePrefix("192.0.0.0/24"),    // protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation (TEST-NET-1)
	netip.MustParsePrefix("192.168.0.0/16"),  // private
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation (TEST-NET-2)
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation (TEST-NET-3)
	netip.MustParsePrefix("224.0.0.0/4"),     // multicast
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, broadcast
	netip.MustParsePrefix("::/128"),          // unspecified
	netip.MustParsePrefix("::1/128"),         // loopback
	netip.MustParsePrefix("fc00::/7"),        // unique local
	netip.MustParsePrefix("fe80::/10"),       // link-local
	netip.MustParsePrefix("fec0::/10"),       // site-local (deprecated)
	netip.MustParsePrefix("ff00::/8"),        // multicast
	// Local-use NAT64 and Teredo reach an IPv4 address they do not
	// carry plainly; the well-known NAT64 and 6to4 prefixes are
	// checked as the IPv4 address they embed (embedded4).
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2001::/32"),
	netip.MustParsePrefix("100::/64"),      // discard
	netip.MustParsePrefix("2001:db8::/32"), // documentation
	netip.MustParsePrefix("::ffff:0:0/96"), // IPv4-mapped: unmapped first
	netip.MustParsePrefix("::/96"),         // IPv4-compatible (deprecated)
	netip.MustParsePrefix("2001:10::/28"),  // ORCHID
}

// internal reports whether a is an address of internalRanges, or an IPv6
// address that embeds an IPv4 one of them.
func internal(a netip.Addr) bool {
	a = a.Unmap()
	if v4, ok := embedded4(a); ok && internal(v4) {
		return true
	}
	for _, p := range internalRanges {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// embedded4 returns the IPv4 address a well-known NAT64 (64:ff9b::/96) or
// 6to4 (2002::/16) address leads to.
func embedded4(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	switch {
	case b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && [8]byte(b[4:12]) == [8]byte{}:
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case b[0] == 0x20 && b[1] == 0x02:
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// interfaceAddrs returns the addresses of the host's own interfaces, which
// reach the host however public they are.
func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("the host's interface addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
