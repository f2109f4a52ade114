package audit

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLogAppendsOneLineAnEvent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(p, []byte(`{"event":"before"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	code, allowed, n := 3, true, int64(42)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			ev := Event{Event: CommandEnd, Session: "s", Terminal: "t", Argv: []string{"sh", "-c", strings.Repeat("x", i*100)}, ExitCode: &code}
			ev.Duration(1500 * time.Microsecond)
			if err := l.Write(ev); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := l.Write(Event{Event: Egress, Host: "h", Port: 443, Allowed: &allowed, BytesSent: &n}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	f, _ := os.Open(p)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	var lines []map[string]any
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 52 || lines[0]["event"] != "before" {
		t.Fatalf("%d lines, first %v", len(lines), lines[0])
	}
	end := lines[1]
	if end["event"] != CommandEnd || end["exit_code"] != 3.0 || end["duration_ms"] != 1.5 || end["signal"] != nil {
		t.Errorf("command_end: %v", end)
	}
	if _, err := time.Parse(time.RFC3339Nano, end["time"].(string)); err != nil || !strings.Contains(end["time"].(string), ".") {
		t.Errorf("time %v: not RFC 3339 with a fraction: %v", end["time"], err)
	}
	eg := lines[51]
	if eg["allowed"] != true || eg["port"] != 443.0 || eg["bytes_sent"] != 42.0 || eg["argv"] != nil {
		t.Errorf("egress: %v", eg)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode())
	}
}

func TestOpenRefusesLinksAndNonFiles(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	os.WriteFile(target, nil, 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(target, link)
	if _, err := Open(link); err == nil {
		t.Error("a link was opened")
	}
	if _, err := Open(dir); err == nil {
		t.Error("a directory was opened")
	}
	p := filepath.Join(dir, "new")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("created %v, %v; want mode 0600", fi, err)
	}
	var none *Log
	if err := none.Write(Event{Event: AgentStart}); err != nil {
		t.Error(err)
	}
}

// TestOpenRefusesLinksOnTheWay: a link in a directory of the path is
// refused as one in its last component is, and nothing is created where
// it leads; a path without one opens, relative too.
func TestOpenRefusesLinksOnTheWay(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	os.Mkdir(real, 0o700)
	os.Symlink(real, filepath.Join(dir, "planted"))
	if l, err := Open(filepath.Join(dir, "planted", "audit.jsonl")); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		l.Close()
		t.Errorf("Open through a linked directory: %v, want a refusal", err)
	}
	if _, err := os.Lstat(filepath.Join(real, "audit.jsonl")); err == nil {
		t.Error("the file was created where the link leads")
	}
	t.Chdir(real)
	l, err := Open("audit.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := os.Lstat(filepath.Join(real, "audit.jsonl")); err != nil {
		t.Errorf("a relative path: %v", err)
	}
}
