package sandbox

import (
	"bytes"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
		{"an environment name not UTF-8", Command{Command: "ls", Env: []EnvVar{{Name: "A\xff", Value: "1"}}}, "env[0]: the name \"A\\xff\" holds bytes"},
		{"an environment value not UTF-8", Command{Command: "ls", Env: []EnvVar{{Name: "FOO", Value: "\xffTOPSECRET"}}}, "env[0]: the value of \"FOO\" holds bytes that are not UTF-8"},
	} {
		err := tc.cmd.Check()
		if err != nil && strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%s: %v shows the environment value", tc.name, err)
		}
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
		// The command is the exec's first process, which a `kill -9 -1`
		// of its own leaves alone.
		{"merged streams, init", Command{Command: "ls"}, true, []string{"/bin/sh", "-c", mergeStderr, "sh", "ls"}},
		{"tty", Command{Command: "bash", TTY: true}, false, []string{"bash"}},
		{"tty, init", Command{Command: "bash", TTY: true, Stdout: io.Discard}, true, []string{"bash"}},
		{"tty of a size, sized from inside", Command{Command: "bash", TTY: true, Cols: 120, Rows: 50}, true, []string{"/bin/sh", "-c", ttySize, "sh", "50", "120", "bash"}},
		{"streams apart", Command{Command: "ls", Stdout: io.Discard, Stderr: io.Discard}, false, []string{"ls"}},
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
	if got, want := sized.execArgv(true, false), []string{"bash"}; !slices.Equal(got, want) {
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
		argv := append(shell[1:], "-c", mergeStderr, "sh", "sh", "-c", `printf '%s|' "$@"; echo err >&2; echo "l=$l"`, "x", "a b", "-n")
		cmd := exec.Command(path, argv...)
		cmd.Env = append(cmd.Environ(), "l=kept")
		// A session of its own, as the engine gives each exec.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if want := "a b|-n|err\nl=kept\n"; err != nil || string(out) != want {
			t.Errorf("%s: %q, %v; want %q", shell, out, err, want)
		}
		// Only the shell's stat line comes on stderr: its session.
		want := "%" + strconv.Itoa(cmd.Process.Pid) + ":"
		if top, ok := sessionLed(bytes.TrimSuffix(stderr.Bytes(), []byte("\n"))); !ok || !strings.HasPrefix(top, want) || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("%s: stderr %q (%q), want the stat line of a session leader %s...", shell, stderr.String(), top, want)
		}
	}
	if found == 0 {
		t.Skip("no dash, bash or busybox here")
	}
}

// TestStartLine: the first line on a merged command's stderr, its shell's
// stat line, sets the session the kill finds its processes by and is not
// output; a first line of another form is.
func TestStartLine(t *testing.T) {
	stat := "42 (sh) S 0 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 123456 2490368 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"
	for _, tc := range []struct {
		name   string
		writes []string
		top    string
		out    string
	}{
		{"whole", []string{stat + "\n"}, "%42:123456 ", ""},
		{"in pieces, more after it", []string{stat[:10], stat[10:] + "\nnot found\n"}, "%42:123456 ", "not found\n"},
		{"no session leader", []string{strings.Replace(stat, "0 42 42", "0 42 41", 1) + "\n"}, "", strings.Replace(stat, "0 42 42", "0 42 41", 1) + "\n"},
		{"another line", []string{"sh: oops\n"}, "", "sh: oops\n"},
		{"cut short", []string{"42 (sh"}, "", "42 (sh"},
	} {
		term := &Terminal{}
		var out bytes.Buffer
		l := &startLine{t: term, w: &out}
		for _, w := range tc.writes {
			if n, err := l.Write([]byte(w)); n != len(w) || err != nil {
				t.Errorf("%s: Write = %d, %v", tc.name, n, err)
			}
		}
		l.flush()
		if term.top != tc.top || out.String() != tc.out {
			t.Errorf("%s: top %q, output %q; want %q, %q", tc.name, term.top, out.String(), tc.top, tc.out)
		}
	}
}
