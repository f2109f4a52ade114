package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReaperMessage: the reaper's line for a command it could not start
// is said in sandboxd's words, however the output is cut into writes;
// anything else passes as it was, a line of the shell's form too: with no
// terminal no shell stands in front of the command, so it is the
// command's own.
func TestReaperMessage(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"the reaper's line", "[FATAL tini (7)] exec nosuch failed: No such file or directory\n", "sandboxd: nosuch: No such file or directory (in img:1, whose PATH is searched)\n"},
		{"and more after it", "[FATAL tini (7)] exec /etc/passwd failed: Permission denied\nmore\n", "sandboxd: /etc/passwd: Permission denied (in img:1, whose PATH is searched)\nmore\n"},
		{"other output", "error: x\n[FATAL tini (7)] exec a failed: b\n", "error: x\n[FATAL tini (7)] exec a failed: b\n"},
		{"alike, but another line", "[FATAL tini (3)] hello\n", "[FATAL tini (3)] hello\n"},
		{"the command's own line like the shell's", "sh: exec: line 0: nosuch: not found\nmore", "sh: exec: line 0: nosuch: not found\nmore"},
		{"dash's line, the command's own", "sh: 1: exec: nosuch: not found\n", "sh: 1: exec: nosuch: not found\n"},
		{"a lone s", "s", "s"},
		{"the prefix alone, at the end", "[FATAL tini (", "[FATAL tini ("},
		{"nothing", "", ""},
	} {
		for cut := 0; cut <= len(tc.in); cut++ {
			var out strings.Builder
			r := &reaperMessage{w: &out, image: "img:1"}
			for _, part := range []string{tc.in[:cut], tc.in[cut:]} {
				if n, err := r.Write([]byte(part)); err != nil || n != len(part) {
					t.Fatalf("%s: Write = %d, %v", tc.name, n, err)
				}
			}
			if err := r.flush(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("%s, cut at %d: %q, want %q", tc.name, cut, out.String(), tc.want)
				break
			}
		}
	}
}

// TestReaperMessageOnATerminal: on a terminal nothing is held back (a
// prompt must show at once); the shell's line, written whole, is still
// said in sandboxd's words.
func TestReaperMessageOnATerminal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
		want   []string // what has passed after each write
	}{
		{"the shell's line", []string{"sh: exec: line 0: nosuch: not found\r\n"}, []string{"sandboxd: nosuch: not found (in img:1, whose PATH is searched)\r\n"}},
		{"bash as sh", []string{"sh: line 1: exec: nosuch: not found\r\n"}, []string{"sandboxd: nosuch: not found (in img:1, whose PATH is searched)\r\n"}},
		{"dash", []string{"sh: 1: exec: nosuch: not found\r\n"}, []string{"sandboxd: nosuch: not found (in img:1, whose PATH is searched)\r\n"}},
		{"the reaper's line", []string{"[FATAL tini (7)] exec nosuch failed: No such file or directory\r\n"}, []string{"sandboxd: nosuch: No such file or directory (in img:1, whose PATH is searched)\r\n"}},
		{"a shell's other line", []string{"sh: syntax error: unexpected \"(\"\r\n"}, []string{"sh: syntax error: unexpected \"(\"\r\n"}},
		{"a prompt", []string{"s", "ure? "}, []string{"s", "sure? "}},
		{"a line like it, later", []string{"$ ", "sh: exec: line 0: x: not found\r\n"}, []string{"$ ", "$ sh: exec: line 0: x: not found\r\n"}},
	} {
		var out strings.Builder
		r := &reaperMessage{w: &out, image: "img:1", terminal: true}
		for i, w := range tc.writes {
			r.Write([]byte(w))
			if out.String() != tc.want[i] {
				t.Errorf("%s: after %q: %q, want %q", tc.name, w, out.String(), tc.want[i])
			}
		}
	}
}

// blockedWriter takes nothing until unblocked: a reader that stopped
// reading.
type blockedWriter struct{ unblock chan struct{} }

func (w blockedWriter) Write(p []byte) (int, error) {
	<-w.unblock
	return len(p), nil
}

type failingWriter struct{ err error }

func (w failingWriter) Write(p []byte) (int, error) { return 0, w.err }

func TestRunOutput(t *testing.T) {
	t.Run("passes everything on, in order", func(t *testing.T) {
		var out bytes.Buffer
		stopping := make(chan struct{})
		o := newRunOutput(&out, func(error) { t.Error("failed") }, stopping)
		var want bytes.Buffer
		for i := range 1000 {
			line := fmt.Sprintf("line %d\n", i)
			want.WriteString(line)
			b := []byte(line)
			o.Write(b)
			copy(b, "XXXX") // the caller's buffer is its own again
		}
		o.close(time.Minute)
		if out.String() != want.String() {
			t.Errorf("output differs: got %d bytes, want %d", out.Len(), want.Len())
		}
	})
	t.Run("a reader that stopped reading holds up no stopping run", func(t *testing.T) {
		w := blockedWriter{unblock: make(chan struct{})}
		defer close(w.unblock)
		stopping := make(chan struct{})
		o := newRunOutput(w, func(error) {}, stopping)
		queued := make(chan struct{})
		go func() {
			defer close(queued)
			for range 100 { // more than the queue holds
				o.Write([]byte("x\n"))
			}
		}()
		close(stopping)
		<-queued // writes no longer wait once the run is stopping
		o.close(10 * time.Millisecond)
		o.Write([]byte("after the end\n")) // dropped, no panic
	})
	t.Run("a failed write ends the run with its error", func(t *testing.T) {
		var cause error
		failed := make(chan struct{})
		o := newRunOutput(failingWriter{syscall.ENOSPC}, func(err error) { cause = err; close(failed) }, make(chan struct{}))
		if n, err := o.Write([]byte("x")); n != 1 || err != nil {
			t.Errorf("Write = %d, %v; want it to pass, the stream must go on", n, err)
		}
		<-failed
		var oe *outputError
		if !errors.As(cause, &oe) || !errors.Is(cause, syscall.ENOSPC) {
			t.Errorf("cause = %v, want an outputError of ENOSPC", cause)
		}
		o.Write([]byte("more")) // fails no second time
		o.close(time.Minute)
	})
}

func TestWorkDir(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(base, "ws")
	for _, d := range []string{"ws/sub", "elsewhere"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"ws/out": filepath.Join(base, "elsewhere"), "ws/in": "sub", "alias": "ws", "ws/dangling": "nowhere"} {
		if err := os.Symlink(target, filepath.Join(base, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(ws, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ws, dir, want, err string
	}{
		{ws, "sub", ws + "/sub", ""},
		{ws, ws + "/sub/", ws + "/sub", ""},
		{ws, ".", ws, ""},
		{ws, "in", ws + "/sub", ""},
		{ws, base + "/alias/sub", ws + "/sub", ""},
		{base + "/alias", "sub", base + "/alias/sub", ""},
		{ws, "out", "", "leads to " + base + "/elsewhere, outside the workspace"},
		{ws, "..", "", "is outside the workspace"},
		{ws, "/", "", "is outside the workspace"},
		{ws, "dangling", "", "no such file"},
		{ws, "file", "", "is not a directory"},
	} {
		got, err := WorkDir(tc.ws, tc.dir)
		if got != tc.want || tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("WorkDir(%s, %s) = %q, %v; want %q, %q", tc.ws, tc.dir, got, err, tc.want, tc.err)
		}
	}
}

func TestExitCode(t *testing.T) {
	code := func(n int) *int { return &n }
	sig := func(s string) *string { return &s }
	tests := []struct {
		st   ExitStatus
		want int
	}{
		{ExitStatus{ExitCode: code(0)}, 0},
		{ExitStatus{ExitCode: code(3)}, 3},
		{ExitStatus{Signal: sig("SIGKILL")}, 137},
		{ExitStatus{Signal: sig("SIGTERM")}, 143},
		{ExitStatus{Signal: sig("SIG10")}, 138},
		{ExitStatus{}, 255},
	}
	for _, tc := range tests {
		if got := ExitCode(tc.st); got != tc.want {
			t.Errorf("ExitCode(%+v) = %d, want %d", tc.st, got, tc.want)
		}
	}
}
