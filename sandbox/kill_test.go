package sandbox

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKillScriptFindsMarkedProcesses runs the kill script on this host's
// /proc against a command in a session of its own, as the engine runs
// each exec, once with grep and once without (as in an image with no
// grep, or a container whose forks all fail), and checks that nothing of
// the command is left: a marked process, a child that removed its marker
// and was orphaned at once (found by its session), and, where the
// command's first process removed its own marker, what it started (found
// by the session sandboxd passes, as the shell in front of the command
// reports it).
func TestKillScriptFindsMarkedProcesses(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc here")
	}
	tests := []struct {
		name, path, line string
		top              bool // the first process's session is passed
		procs            int  // of the command, once started
	}{
		{"with grep", os.Getenv("PATH"), "sleep 301 & (env -u " + MarkerEnv + " sleep 302 &); echo started; wait", false, 3},
		{"without grep", t.TempDir(), "sleep 301 & (env -u " + MarkerEnv + " sleep 302 &); echo started; wait", false, 3},
		{"first process unmarked", os.Getenv("PATH"), "exec env -u " + MarkerEnv + " /bin/sh -c '(sleep 303 &); echo started; exec sleep 304'", true, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sid, marker := startMarked(t, tc.line)
			eventually(t, "the command's processes", func() bool { return len(inSession(sid)) == tc.procs })
			known := ""
			if tc.top {
				stat, err := os.ReadFile("/proc/" + strconv.Itoa(sid) + "/stat")
				if err != nil {
					t.Fatal(err)
				}
				var ok bool
				if known, ok = sessionLed(bytes.TrimSpace(stat)); !ok {
					t.Fatalf("no session in %q", stat)
				}
			}
			kill := exec.Command("/bin/sh", "-c", killScript, "sh", "KILL", known, "-e", marker)
			kill.Env = []string{"PATH=" + tc.path}
			var stderr bytes.Buffer
			kill.Stderr = &stderr
			if err := kill.Run(); err != nil {
				t.Fatalf("kill script: %v: %s", err, stderr.String())
			}
			if left := append(marked(marker), inSession(sid)...); len(left) > 0 {
				t.Errorf("processes left after the kill: %v (stderr %q)", left, stderr.String())
			}
		})
	}
}

// startMarked starts /bin/sh -c line with a new terminal's marker, in a
// session of its own as the engine starts each exec, and returns once it
// printed a line (reaped as soon as it dies, as the engine reaps a
// command); the test's end kills what of it is left.
func startMarked(t *testing.T, line string) (sid int, marker string) {
	t.Helper()
	id, err := randomID(8)
	if err != nil {
		t.Fatal(err)
	}
	marker = MarkerEnv + "=term_" + id
	cmd := exec.Command("/bin/sh", "-c", line)
	cmd.Env = append(os.Environ(), marker)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_, err = out.Read(make([]byte, 8))
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		known := "%" + strconv.Itoa(cmd.Process.Pid) + ":0"
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat"); err == nil {
			known, _ = sessionLed(bytes.TrimSpace(stat))
		}
		exec.Command("/bin/sh", "-c", killScript, "sh", "KILL", known, "-e", marker).Run()
		cmd.Process.Kill()
		<-exited
	})
	if err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid, marker
}

// inSession lists the live processes of session sid.
func inSession(sid int) []string {
	var pids []string
	files, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 3 && f[3] == strconv.Itoa(sid) && f[0] != "Z" {
			pids = append(pids, string(b[:bytes.IndexByte(b, ' ')]))
		}
	}
	return pids
}

// TestKillScriptPrintsSessionsFirst: the SIGTERM pass prints the sessions
// it found ahead of the pairs, so that the cut to maxKnown keeps them.
func TestKillScriptPrintsSessionsFirst(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc here")
	}
	sid, marker := startMarked(t, "trap '' TERM; sleep 305 & echo started; wait")
	got, err := exec.Command("/bin/sh", "-c", killScript, "sh", "TERM", "", "-e", marker).Output()
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(got))
	if want := "%" + strconv.Itoa(sid) + ":"; len(f) != 3 || !strings.HasPrefix(f[0], want) || strings.HasPrefix(f[1], "%") {
		t.Errorf("TERM pass printed %q, want the session %s... and then two pairs", got, want)
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
