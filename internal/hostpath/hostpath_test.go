package hostpath

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckPrivateFile: a file is judged as a directory is, by its own
// mode and owner and by every parent's. (images' tests run the directory
// cases through their cache check.)
func TestCheckPrivateFile(t *testing.T) {
	uid := os.Getuid()
	file := func(t *testing.T, dir string, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(dir, "sandbox.toml")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T, base string) string
		wantErr string
	}{
		{"private", func(t *testing.T, base string) string { return file(t, base, 0o600) }, ""},
		{"readable by all", func(t *testing.T, base string) string { return file(t, base, 0o644) }, ""},
		{"group-writable", func(t *testing.T, base string) string { return file(t, base, 0o664) }, ""},
		{"writable by others", func(t *testing.T, base string) string { return file(t, base, 0o666) }, "writable by others (mode 0666)"},
		{"in an open directory", func(t *testing.T, base string) string {
			d := filepath.Join(base, "open")
			if err := os.Mkdir(d, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(d, 0o777); err != nil {
				t.Fatal(err)
			}
			return file(t, d, 0o600)
		}, "writable by others and not sticky"},
		{"owned by another user", func(t *testing.T, base string) string {
			if uid != 0 {
				t.Skip("needs root to give a file away")
			}
			p := file(t, base, 0o644)
			if err := os.Chown(p, 4242, 4242); err != nil {
				t.Fatal(err)
			}
			return p
		}, "owned by uid 4242"},
		{"missing", func(t *testing.T, base string) string { return filepath.Join(base, "missing") }, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, err := filepath.EvalSymlinks(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			p := tt.setup(t, base)
			got, err := CheckPrivate(p, uid)
			if tt.wantErr == "" && (err != nil || got != p) || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("CheckPrivate(%s) = %q, %v; want error %q", p, got, err, tt.wantErr)
			}
		})
	}
}
