package sandbox

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKillScriptFindsMarkedProcesses runs the kill script on this host's
// /proc against a marked tree with an orphan in it, once with grep and
// once without (as in an image with no grep, or a container whose forks
// all fail), and checks that nothing marked is left.
func TestKillScriptFindsMarkedProcesses(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc here")
	}
	tests := []struct {
		name, path string
	}{
		{"with grep", os.Getenv("PATH")},
		{"without grep", t.TempDir()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, err := randomID(8)
			if err != nil {
				t.Fatal(err)
			}
			marker := MarkerEnv + "=term_" + id
			// The subshell's sleep is orphaned at once: only its marker
			// ties it to the command.
			cmd := exec.Command("/bin/sh", "-c", "sleep 301 & (sleep 302 &); echo started; wait")
			cmd.Env = append(os.Environ(), marker)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Reaped as soon as it dies, as the engine reaps a command.
			exited := make(chan struct{})
			defer func() {
				cmd.Process.Kill()
				<-exited
			}()
			line := make([]byte, 8)
			if _, err := out.Read(line); err != nil {
				t.Fatal(err)
			}
			eventually(t, "three marked processes", func() bool { return len(marked(marker)) == 3 })
			go func() {
				cmd.Wait()
				close(exited)
			}()

			kill := exec.Command("/bin/sh", "-c", killScript, "sh", "KILL", "", "-e", marker)
			kill.Env = []string{"PATH=" + tc.path}
			var stderr bytes.Buffer
			kill.Stderr = &stderr
			if err := kill.Run(); err != nil {
				t.Fatalf("kill script: %v: %s", err, stderr.String())
			}
			if left := marked(marker); len(left) > 0 {
				t.Errorf("processes left after the kill: %v (stderr %q)", left, stderr.String())
			}
		})
	}
}

// marked lists the processes whose environment holds marker.
func marked(marker string) []string {
	var pids []string
	files, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for v := range bytes.SplitSeq(b, []byte{0}) {
			if string(v) == marker {
				pids = append(pids, strings.Split(f, "/")[2])
			}
		}
	}
	return pids
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 30s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKillWaitsForTheKillUnderWay: a command that exited on the first
// signal may have left processes that ignore it; a second kill while the
// first still works toward SIGKILL waits for it rather than report the
// command killed.
func TestKillWaitsForTheKillUnderWay(t *testing.T) {
	term := &Terminal{ID: "term_x", done: make(chan struct{})}
	close(term.done) // the command exited on SIGTERM
	k := &killing{done: make(chan struct{})}
	term.kill = k
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := term.Kill(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Kill during a kill under way = %v, want it to wait (here until its deadline)", err)
	}
	close(k.done)
	if err := term.Kill(context.Background()); err != nil {
		t.Errorf("Kill once the kill under way ended = %v, want its result, nil", err)
	}
	term.kill = nil
	if err := term.Kill(context.Background()); err != nil {
		t.Errorf("Kill of an exited command = %v, want nil", err)
	}
}

func TestPairsOnly(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"@123 %45 %0 12:345 13:346 ", "12:345 13:346 "},
		{"12:345 ", "12:345 "},
	} {
		if got := pairsOnly(tc.in); got != tc.want {
			t.Errorf("pairsOnly(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
