package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

// TestAuditOutsideWhatCommandsWrite: an audit log in the workspace or a
// grant is refused; one elsewhere is opened.
func TestAuditOutsideWhatCommandsWrite(t *testing.T) {
	ws, grant, elsewhere := t.TempDir(), t.TempDir(), t.TempDir()
	var cfg sandbox.Config
	cfg.Session.Workspace = ws
	cfg.Session.Mounts = []sandbox.Mount{{Source: grant, Target: "/data", Mode: "rw"}}
	for _, file := range []string{filepath.Join(ws, "audit.jsonl"), filepath.Join(grant, "sub", "audit.jsonl"), ws} {
		var c containment
		var ue usageError
		if err := c.openAudit(file, cfg); !errors.As(err, &ue) || !strings.Contains(err.Error(), "which commands can write") {
			t.Errorf("--audit %s: %v, want a refusal", file, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(ws, "audit.jsonl")); err == nil {
		t.Error("the refused file was created")
	}
	var c containment
	if err := c.openAudit(filepath.Join(elsewhere, "audit.jsonl"), cfg); err != nil || c.audit == nil {
		t.Fatalf("--audit outside: %v", err)
	}
	c.audit.Close()
}

// TestEnvValueNeverShown: --env names a variable whose value cannot be
// passed by its name alone.
func TestEnvValueNeverShown(t *testing.T) {
	t.Setenv("SANDBOXD_TEST_FOO", "\xffTOPSECRET")
	f := containFlags{contain: true, env: stringList{"SANDBOXD_TEST_FOO"}}
	_, err := f.check(t.TempDir())
	if err == nil || strings.Contains(err.Error(), "SECRET") || !strings.Contains(err.Error(), "SANDBOXD_TEST_FOO") {
		t.Errorf("check: %v, want an error naming the variable, not its value", err)
	}
}
