package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCommandLineErrors: a mistake on the command line exits 2 with one
// message that names it (and where to read more), before anything touches
// the engine; help asked for goes to stdout and exits 0.
func TestCommandLineErrors(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// A directory to grant that neither holds nor lies in the workspace,
	// wherever the checkout is.
	src := t.TempDir()
	tests := []struct {
		args []string
		code int
		want string // in stderr, once
	}{
		{[]string{"serve", "--bogus"}, 2, "sandboxd serve: flag provided but not defined: -bogus (see 'sandboxd serve -h')"},
		{[]string{"help"}, 0, "Usage:\n  sandboxd wrap"},
		{[]string{"run", "-h"}, 0, "Usage: sandboxd run"},
		{[]string{"run", "-it", "--", "sh"}, 2, "-i with -t: stdin is not a terminal"},
		{[]string{"run", "-e", "=x", "--", "true"}, 2, "sandboxd run: -e \"=x\": env.name: must not be empty"},
		{[]string{"run", "-e", "", "--", "true"}, 2, "sandboxd run: -e \"\": env.name: must not be empty"},
		{[]string{"run", "-e", "SANDBOXD_TERMINAL=x", "--", "true"}, 2, "SANDBOXD_TERMINAL is reserved"},
		{[]string{"run", "-w", "/", "--", "true"}, 2, "-w: / is outside the workspace"},
		{[]string{"run", "--", ""}, 2, "sandboxd run: command: must not be empty"},
		{[]string{"run", "-w", "no-such-dir", "--", "true"}, 2, "sandboxd run: -w: lstat "},
		{[]string{"run", "--", "-h"}, 2, "starts with '-'"},
		{[]string{"run", "--", "rm", "caf\xe9"}, 2, "args[0]: \"caf\\xe9\" holds bytes that are not UTF-8"},
		{[]string{"run", "-e", "X=a\xffb", "--", "true"}, 2, "holds bytes that are not UTF-8"},
		{[]string{"run", "-i", "-t", "--", "sh"}, 2, "-i with -t: stdin is not a terminal"},
		{[]string{"run", "-ti", "--", "sh"}, 2, "-i with -t: stdin is not a terminal"},
		{[]string{"run", "--pids", "0", "--", "true"}, 2, "--pids: invalid pids limit \"0\": must be at least 8"},
		{[]string{"run", "--memory", "0.5", "--", "true"}, 2, "--memory: invalid size \"0.5\": must be at least 6MiB"},
		{[]string{"wrap", "--pids", "0", "--", "true"}, 2, "--pids: invalid pids limit \"0\""},
		{[]string{"run", "--memory", strings.Repeat("9", 1000), "--", "true"}, 2, "longer than 64 characters"},
		{[]string{"serve", "--listen", "unix:"}, 2, "--listen \"unix:\": want stdio or unix:PATH"},
		{[]string{"serve", "--listen", "tcp:1"}, 2, "--listen \"tcp:1\""},
		{[]string{"serve", "--ahp-listen", "127.0.0.1:0", "--ahp-max-content", "0"}, 2, "--ahp-max-content: 0 must be from 1KiB to 1GiB"},
		{[]string{"wrap", "--ahp-max-content", "2GiB", "--", "true"}, 2, "--ahp-max-content: 2GiB must be from 1KiB to 1GiB"},
		{[]string{"image", "build", "extra", "--ref", "x"}, 2, "unexpected argument \"extra\""},
		{[]string{"gc", "extra"}, 2, "unexpected argument \"extra\""},
		{[]string{"image", "-h"}, 0, "Usage: sandboxd image build"},
		{[]string{"gc", "-h"}, 0, "Usage: sandboxd gc"},
		{[]string{"nope"}, 2, "unknown command \"nope\""},
		{[]string{"config", "-h"}, 0, "overrides key by key.\n"},
		{[]string{"help", "run"}, 0, "Usage: sandboxd run"},
		{[]string{"help", "nope"}, 2, "unknown command \"nope\""},
		{[]string{"version"}, 0, "sandboxd "},
		{[]string{"--version"}, 0, "sandboxd "},
		{[]string{"version", "-h"}, 0, "Usage: sandboxd version"},
		{[]string{"help", "version"}, 0, "Usage: sandboxd version"},
		{[]string{"version", "extra"}, 2, "unexpected argument \"extra\""},
		{[]string{"--version", "extra"}, 2, "unexpected argument \"extra\""},
		{[]string{"config", "extra"}, 2, "unexpected argument \"extra\""},
		// Allowed in form, not by the configuration: still refused before
		// the engine is asked (it is not reachable here).
		{[]string{"run", "--memory", "64GiB", "--", "true"}, 2, "sandboxd run: --memory 64GiB is above the maximum of"},
		{[]string{"run", "--network", "host", "--", "true"}, 2, "sandboxd run: --network: \"host\" is not allowed"},
		{[]string{"wrap", "--cpus", "64", "--", "true"}, 2, "sandboxd wrap: --cpus 64 is too many"},
		// An empty value would silently stand for the default.
		{[]string{"run", "--cpus", "", "--", "true"}, 2, "invalid value \"\" for flag -cpus: empty or blank"},
		{[]string{"wrap", "--image", " ", "--", "true"}, 2, "invalid value \" \" for flag -image: empty or blank"},
		{[]string{"run", "--config", "", "--", "true"}, 2, "invalid value \"\" for flag -config: empty or blank"},
		{[]string{"serve", "--log", ""}, 2, "invalid value \"\" for flag -log: empty or blank"},
		{[]string{"run", "-w", "", "--", "true"}, 2, "invalid value \"\" for flag -w: empty or blank"},
		{[]string{"wrap", "--agent-grace", "-1s", "--", "true"}, 2, "--agent-grace: -1s is negative"},
		{[]string{"run", "-v", "data", "--", "true"}, 2, "sandboxd run: -v \"data\": want SRC:DST[:ro|rw]"},
		{[]string{"run", "-v", ":/data", "--", "true"}, 2, "-v \":/data\": want SRC:DST"},
		{[]string{"run", "-v", "/a:/b:c:d", "--", "true"}, 2, "a path with a colon in it only in session.mounts"},
		{[]string{"run", "-v", "/tmp:/data:rx", "--", "true"}, 2, "-v \"/tmp:/data:rx\": mode \"rx\" is not ro or rw"},
		{[]string{"run", "-v", "/proc:/p", "--", "true"}, 2, "sandboxd run: -v \"/proc:/p\": source \"/proc\" is or holds the host's /proc"},
		{[]string{"run", "-v", "/:/host:ro", "--", "true"}, 2, "sandboxd run: -v \"/:/host:ro\": source \"/\" is or holds "},
		{[]string{"run", "-v", "/tmp:/proc/x", "--", "true"}, 2, "sandboxd run: -v \"/tmp:/proc/x\": target of \"/tmp\""},
		{[]string{"run", "-v", "/tmp:" + wd, "--", "true"}, 2, "target \"" + wd + "\" is or holds the workspace"},
		{[]string{"run", "-v", "/tmp:" + filepath.Dir(wd), "--", "true"}, 2, "is or holds the workspace"},
		{[]string{"run", "-v", strings.Repeat("x", 5000) + ":/d", "--", "true"}, 2, "longer than 4096 bytes"},
		{[]string{"run", "-v", "/tmp/caf\xe9:/d", "--", "true"}, 2, "holds bytes that are not UTF-8"},
		{[]string{"run", "-v", src + ":/d", "-v", src + ":/d/", "--", "true"}, 2, "sandboxd run: -v \"" + src + ":/d/\": targets \"/d\" and \"/d/\" are the same path"},
	}
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " ")[:min(40, len(strings.Join(tc.args, " ")))], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, strings.NewReader(""), &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr %q", code, tc.code, stderr.String())
			}
			out, other := &stderr, &stdout
			if tc.code == 0 {
				out, other = &stdout, &stderr
			}
			if n := strings.Count(out.String(), tc.want); n != 1 {
				t.Errorf("%q appears %d times, want once in:\n%s", tc.want, n, out.String())
			}
			if other.Len() > 0 {
				t.Errorf("%q on the other stream, want nothing", other.String())
			}
			if tc.code == 2 && strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("stderr has more than one line:\n%s", stderr.String())
			}
		})
	}
}

// TestRunAndWrapFailuresHaveTheirOwnCode: when sandboxd itself fails under
// run or wrap, it exits 125, a code apart from the command's or agent's.
func TestRunAndWrapFailuresHaveTheirOwnCode(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	for _, args := range [][]string{{"run", "--", "true"}, {"wrap", "--", "true"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, strings.NewReader(""), &stdout, &stderr); code != 125 {
			t.Errorf("%q without an engine: exit code %d, want 125; stderr %q", args, code, stderr.String())
		}
	}
}

type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// TestFailedWritesAreTold: output that cannot be written (a full disk)
// fails the command, and says so, rather than exiting 0 with nothing
// written.
func TestFailedWritesAreTold(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"config"}, {"version"}, {"config", "-h"}, {"gc", "-h"}, {"run", "-h"}} {
		var stderr bytes.Buffer
		if code := run(args, strings.NewReader(""), fullWriter{}, &stderr); code == 0 || !strings.Contains(stderr.String(), "no space left on device") {
			t.Errorf("%q into a full disk: exit %d, stderr %q; want a failure that says why", args, code, stderr.String())
		}
	}
}
