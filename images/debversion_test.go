package images

import (
	"os/exec"
	"testing"
)

// versionCases are pairs of Debian versions and how the first compares to
// the second.
var versionCases = []struct {
	a, b string
	want int
}{
	{"1.36.1-9", "1.36.1-10", -1},
	{"1:1.35.0-4+deb12u1+b1", "1:1.36.1-9", -1},
	{"1:1.0", "2.0", 1},
	{"0:1.0", "1.0", 0},
	{"1.0", "1.0", 0},
	{"1.00", "1.0", 0},
	{"1.0-1", "1.0-01", 0},
	{"1.0", "1.0-0", 0},
	{"1.0~rc1", "1.0", -1},
	{"1.0~~", "1.0~", -1},
	{"1.0~", "1.0", -1},
	{"1.0", "1.0a", -1},
	{"1.0a", "1.0+", -1},
	{"1.0a", "1.0b", -1},
	{"1.0", "1.0+b1", -1},
	{"1.0", "1.0.1", -1},
	{"1.0-1", "1.0-1.1", -1},
	{"2.0-1~bpo12+1", "2.0-1", -1},
	{"10", "9", 1},
	{"5.2.15-2+b13", "5.2.21-2.1", -1},
	{"1.0-beta-2", "1.0-beta-10", -1},
	{"1.20240101000000000000000", "1.20240101000000000000001", -1},
	{"2:0.1", "10:0.1", -1},
	{"1.0-a", "1.0-+", -1},
}

func TestCompareVersions(t *testing.T) {
	for _, tt := range versionCases {
		if got := compareVersions(tt.a, tt.b); got != tt.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := compareVersions(tt.b, tt.a); got != -tt.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", tt.b, tt.a, got, -tt.want)
		}
	}
}

// The table above says what dpkg says.
func TestVersionCasesAgreeWithDpkg(t *testing.T) {
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("dpkg is not installed")
	}
	for _, tt := range versionCases {
		op := map[int]string{-1: "lt", 0: "eq", 1: "gt"}[tt.want]
		if err := exec.Command("dpkg", "--compare-versions", tt.a, op, tt.b).Run(); err != nil {
			t.Errorf("dpkg --compare-versions %s %s %s: %v", tt.a, op, tt.b, err)
		}
	}
}
