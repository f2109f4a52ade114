package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestEndpointsOutsideTheWorkspace: serve does not start when its socket
// or the AHP token file would lie in the workspace every container sees,
// and says so before the engine is asked (it is not reachable here).
func TestEndpointsOutsideTheWorkspace(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	ws := t.TempDir()
	t.Chdir(ws)
	for _, args := range [][]string{
		{"serve", "--listen", "unix:sandboxd.sock"},
		{"serve", "--ahp-listen", "127.0.0.1:0", "--ahp-token-file", filepath.Join(ws, "sub", "token")},
		{"wrap", "--ahp-listen", "127.0.0.1:0", "--ahp-token-file", "token", "--", "true"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(args, strings.NewReader(""), &stdout, &stderr)
		if code == 0 || !strings.Contains(stderr.String(), "a file of sandboxd's own") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
	// An abstract socket is in no directory: only the engine is missing.
	var stdout, stderr bytes.Buffer
	if code := run([]string{"serve", "--listen", "unix:@sandboxd"}, strings.NewReader(""), &stdout, &stderr); code == 0 || strings.Contains(stderr.String(), "endpoint") || !strings.Contains(stderr.String(), "engine") {
		t.Errorf("serve on an abstract socket: exit %d, stderr %q", code, stderr.String())
	}
}
