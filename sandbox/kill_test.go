package sandbox

import (
	"bytes"
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
