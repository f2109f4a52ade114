package sandbox

import (
	"strings"
	"testing"
)

// TestReaperMessage: the reaper's line for a command it could not start
// is said in sandboxd's words, however the output is cut into writes;
// anything else passes as it was.
func TestReaperMessage(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"the reaper's line", "[FATAL tini (7)] exec nosuch failed: No such file or directory\n", "sandboxd: nosuch: No such file or directory (in img:1, whose PATH is searched)\n"},
		{"and more after it", "[FATAL tini (7)] exec /etc/passwd failed: Permission denied\nmore\n", "sandboxd: /etc/passwd: Permission denied (in img:1, whose PATH is searched)\nmore\n"},
		{"other output", "error: x\n[FATAL tini (7)] exec a failed: b\n", "error: x\n[FATAL tini (7)] exec a failed: b\n"},
		{"alike, but another line", "[FATAL tini (3)] hello\n", "[FATAL tini (3)] hello\n"},
		{"the prefix alone, at the end", "[FATAL tini (", "[FATAL tini ("},
		{"nothing", "", ""},
	} {
		for cut := 0; cut <= len(tc.in); cut++ {
			var out strings.Builder
			r := &reaperMessage{w: &out, image: "img:1"}
			for _, part := range []string{tc.in[:cut], tc.in[cut:]} {
				if n, err := r.Write([]byte(part)); err != nil || n != len(part) {
					t.Fatalf("%s: Write = %d, %v", tc.name, n, err)
				}
			}
			if err := r.flush(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("%s, cut at %d: %q, want %q", tc.name, cut, out.String(), tc.want)
				break
			}
		}
	}
}
