package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestGCWithoutEngine: with no engine to list containers, gc says so and
// claims no count.
func TestGCWithoutEngine(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"gc"}, strings.NewReader(""), &stdout, &stderr); code != 1 {
		t.Errorf("exit code %d, want 1; stderr %q", code, stderr.String())
	}
	if stdout.Len() > 0 {
		t.Errorf("stdout %q, want nothing", stdout.String())
	}
	if !strings.HasPrefix(stderr.String(), "sandboxd gc: ") {
		t.Errorf("stderr %q, want the error", stderr.String())
	}
}
