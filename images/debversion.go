package images

import (
	"cmp"
	"net/url"
	"path/filepath"
	"strings"
)

// debVersion is the version in a .deb's file name, package_version_arch.deb,
// which apt writes with the epoch's ':' escaped as "%3a".
func debVersion(path string) string {
	parts := strings.Split(strings.TrimSuffix(filepath.Base(path), ".deb"), "_")
	if len(parts) != 3 {
		return ""
	}
	v, err := url.PathUnescape(parts[1])
	if err != nil {
		return parts[1]
	}
	return v
}

// compareVersions compares two Debian versions, [epoch:]upstream[-revision],
// as dpkg does, returning -1, 0 or +1.
func compareVersions(a, b string) int {
	ae, au, ar := splitVersion(a)
	be, bu, br := splitVersion(b)
	if c := compareVersionPart(ae, be); c != 0 {
		return c
	}
	if c := compareVersionPart(au, bu); c != 0 {
		return c
	}
	return compareVersionPart(ar, br)
}

// splitVersion splits at the first ':' and the last '-', as dpkg does.
func splitVersion(v string) (epoch, upstream, revision string) {
	if i := strings.IndexByte(v, ':'); i >= 0 {
		epoch, v = v[:i], v[i+1:]
	}
	if i := strings.LastIndexByte(v, '-'); i >= 0 {
		v, revision = v[:i], v[i+1:]
	}
	return epoch, v, revision
}

// compareVersionPart is dpkg's verrevcmp: runs of non-digits compare char by
// char with '~' before the end of the string, the end before letters and
// letters before other characters; runs of digits compare as numbers (of any
// length).
func compareVersionPart(a, b string) int {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		for i < len(a) && !isDigit(a[i]) || j < len(b) && !isDigit(b[j]) {
			if ac, bc := versionOrder(a, i), versionOrder(b, j); ac != bc {
				return cmp.Compare(ac, bc)
			}
			i++
			j++
		}
		for i < len(a) && a[i] == '0' {
			i++
		}
		for j < len(b) && b[j] == '0' {
			j++
		}
		firstDiff := 0
		for i < len(a) && j < len(b) && isDigit(a[i]) && isDigit(b[j]) {
			if firstDiff == 0 {
				firstDiff = cmp.Compare(a[i], b[j])
			}
			i++
			j++
		}
		if i < len(a) && isDigit(a[i]) {
			return 1
		}
		if j < len(b) && isDigit(b[j]) {
			return -1
		}
		if firstDiff != 0 {
			return firstDiff
		}
	}
	return 0
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// versionOrder is the weight of s[i] in a run of non-digits: '~' lowest,
// then the end of s (or a digit), then letters, then other characters.
func versionOrder(s string, i int) int {
	if i >= len(s) {
		return 0
	}
	switch c := s[i]; {
	case isDigit(c):
		return 0
	case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		return int(c)
	case c == '~':
		return -1
	default:
		return int(c) + 256
	}
}
