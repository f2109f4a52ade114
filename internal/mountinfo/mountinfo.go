package mountinfo

import (
	"strconv"
	"strings"
)

// Mount is one line of a mountinfo table.
type Mount struct {
	// Root is the path within the filesystem that is mounted at Point.
	Root  string
	Point string
	// FSType and Options are the filesystem's type and its own options
	// (after the " - " separator; for a cgroup v1 hierarchy they name its
	// controllers). Empty in a line without the separator.
	FSType, Options string
}

// Parse reads a mountinfo table; a line with too few fields is left out.
// Fields are split at single spaces, the only separator: the kernel
// escapes space, tab, newline and backslash in a path, but not a
// no-break space or a carriage return, at which strings.Fields would cut
// a name short.
func Parse(table []byte) []Mount {
	var mounts []Mount
	for _, line := range strings.Split(string(table), "\n") {
		f := strings.Split(line, " ")
		if len(f) < 5 {
			continue
		}
		m := Mount{Root: unescape(f[3]), Point: unescape(f[4])}
		// Optional fields (shared:N, master:N) come after the mount's
		// options, up to a field that is a single "-".
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				if i+3 < len(f) {
					m.FSType, m.Options = f[i+1], f[i+3]
				}
				break
			}
		}
		mounts = append(mounts, m)
	}
	return mounts
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				out.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		out.WriteByte(s[i])
	}
	return out.String()
}
