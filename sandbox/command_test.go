package sandbox

import (
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestCommandCheck: what the engine's API cannot carry, or a shell would
// read as something else, is refused before the engine is asked.
func TestCommandCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmd  Command
		want string // in the error; "" for none
	}{
		{"plain", Command{Command: "ls", Args: []string{"-l"}, Cwd: "/w"}, ""},
		{"no command", Command{}, "command: must not be empty"},
		{"an option for a command", Command{Command: "-x"}, "starts with '-'"},
		{"a NUL in an argument", Command{Command: "ls", Args: []string{"a\x00b"}}, "args[0]: contains a NUL byte"},
		{"a cwd not UTF-8", Command{Command: "ls", Cwd: "/w/caf\xe9"}, "cwd: \"/w/caf\\xe9\" holds bytes that are not UTF-8"},
		{"an environment name not UTF-8", Command{Command: "ls", Env: []EnvVar{{Name: "A\xff", Value: "1"}}}, "env[0]"},
	} {
		err := tc.cmd.Check()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestCommandArgv(t *testing.T) {
	tests := []struct {
		cmd  Command
		want []string
	}{
		{Command{Command: "ls"}, []string{"ls"}},
		{Command{Command: "ls", Args: []string{"-la", "a b"}}, []string{"ls", "-la", "a b"}},
		{Command{Command: "ls -la"}, []string{"/bin/sh", "-c", "ls -la"}},
		{Command{Command: "make && make test"}, []string{"/bin/sh", "-c", "make && make test"}},
		{Command{Command: "/usr/bin/env"}, []string{"/usr/bin/env"}},
		// With args the command is a program name, whatever it contains.
		{Command{Command: "my prog", Args: []string{"x"}}, []string{"my prog", "x"}},
	}
	for _, tc := range tests {
		if got := tc.cmd.Argv(); strings.Join(got, "\x00") != strings.Join(tc.want, "\x00") {
			t.Errorf("%+v.Argv() = %q, want %q", tc.cmd, got, tc.want)
		}
	}
}

func TestCommandExecArgv(t *testing.T) {
	tests := []struct {
		name   string
		cmd    Command
		reaper bool
		want   []string
	}{
		{"merged streams", Command{Command: "ls"}, false, []string{"/bin/sh", "-c", mergeStderr, "sh", "ls"}},
		{"merged streams, reaper", Command{Command: "ls"}, true, []string{reaperPath, "-s", "--", "/bin/sh", "-c", mergeStderr, "sh", "ls"}},
		{"tty", Command{Command: "bash", TTY: true}, false, []string{"bash"}},
		{"tty, reaper", Command{Command: "bash", TTY: true}, true, []string{reaperPath, "-s", "--", "bash"}},
		{"tty of a size, sized from inside", Command{Command: "bash", TTY: true, Cols: 120, Rows: 50}, true, []string{reaperPath, "-s", "--", "/bin/sh", "-c", ttySize, "sh", "50", "120", "bash"}},
		{"streams apart, reaper", Command{Command: "ls", Stdout: io.Discard, Stderr: io.Discard}, true, []string{reaperPath, "-s", "--", "ls"}},
	}
	for _, tc := range tests {
		if got := tc.cmd.execArgv(tc.reaper, true); !slices.Equal(got, tc.want) {
			t.Errorf("%s: execArgv = %q, want %q", tc.name, got, tc.want)
		}
	}
	// An engine that takes the size given with the exec needs no shell
	// in front.
	sized := Command{Command: "bash", TTY: true, Cols: 120, Rows: 50}
	if got, want := sized.execArgv(true, false), []string{reaperPath, "-s", "--", "bash"}; !slices.Equal(got, want) {
		t.Errorf("tty of a size on API 1.42: execArgv = %q, want %q", got, want)
	}
}

// TestMergeStderrUnderTheShells: the entry point runs the command as given,
// its stderr joined to its stdout, under each /bin/sh an image may have
// (dash on Debian and Ubuntu, bash, busybox): those found here.
func TestMergeStderrUnderTheShells(t *testing.T) {
	found := 0
	for _, shell := range [][]string{{"dash"}, {"bash"}, {"busybox", "sh"}} {
		path, err := exec.LookPath(shell[0])
		if err != nil {
			continue
		}
		found++
		argv := append(shell[1:], "-c", mergeStderr, "sh", "sh", "-c", `printf '%s|' "$@"; echo err >&2`, "x", "a b", "-n")
		out, err := exec.Command(path, argv...).Output()
		if want := "a b|-n|err\n"; err != nil || string(out) != want {
			t.Errorf("%s: %q, %v; want %q", shell, out, err, want)
		}
	}
	if found == 0 {
		t.Skip("no dash, bash or busybox here")
	}
}
