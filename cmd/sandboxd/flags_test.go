package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestHelpWithoutFlagsHasNoFlagsHeading: a command with no flags shows no
// empty list of them.
func TestHelpWithoutFlagsHasNoFlagsHeading(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"config", "-h"}, strings.NewReader(""), &stdout, &stderr); code != 0 || strings.Contains(stdout.String(), "Flags:") {
		t.Errorf("config -h: exit %d, %q", code, stdout.String())
	}
}
