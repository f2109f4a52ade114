package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestImageHelpShowsFlags: every way of asking for image's help shows the
// flags of its one command, build.
func TestImageHelpShowsFlags(t *testing.T) {
	for _, args := range [][]string{{"help", "image"}, {"image", "-h"}, {"image", "help"}, {"image", "build", "-h"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, strings.NewReader(""), &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "-ref string") {
			t.Errorf("%v: exit %d, %q", args, code, stdout.String())
		}
	}
}
