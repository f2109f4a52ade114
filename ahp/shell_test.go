package ahp

import (
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/ahp/osc633"
	"github.com/sandboxd/sandboxd/internal/console"
)

// TestShellIntegrationEscapesWhatEndsASequence: a directory name or a
// command line may hold any byte; the shell integration escapes every one
// that ends or cancels an OSC sequence (BEL, ESC, CAN, SUB, the C1 ST and
// OSC), so the sequence reaches the parser whole, the value comes back as
// it was, and no part of it, the nonce least of all, shows as data.
func TestShellIntegrationEscapesWhatEndsASequence(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash here")
	}
	const nonce = "n0nce"
	for _, locale := range []string{"C", "C.UTF-8"} {
		for _, tc := range []struct{ name, value string }{
			{"plain", "/w/project"},
			{"separators and escapes", "/w/a;b\\c\\x41\nd"},
			{"BEL and ESC", "/w/a\ab\x1b]0;x\x1b\\"},
			{"CAN", "/w/a\x18b"},
			{"SUB", "/w/a\x1ab"},
			{"C1 ST", "/w/a\u009cb"},
			{"C1 OSC", "/w/a\u009db"},
			{"a lone C1 lead byte", "/w/a\xc2"},
			{"invalid UTF-8", "/w/\xff\xfe\x9c\x9d"},
		} {
			script := ShellIntegration + "\n__sbx_nonce=" + nonce + "\nprintf '\\033]633;P;Cwd=%s;%s\\007\\033]633;E;%s;%s\\007' \"$(__sbx_esc \"$1\")\" \"$__sbx_nonce\" \"$(__sbx_esc \"$1\")\" \"$__sbx_nonce\"\n"
			cmd := exec.Command(bash, "--norc", "--noprofile", "-c", script, "bash", tc.value)
			cmd.Env = []string{"LC_ALL=" + locale, "PATH=/usr/bin:/bin"}
			raw, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s, %s: %v", locale, tc.name, err)
			}
			out, events := osc633.NewParser(nonce).Feed(raw)
			if len(out) != 0 {
				t.Errorf("%s, %s: %q shows as data", locale, tc.name, out)
			}
			if len(events) != 2 || events[0].Kind != 'P' || events[0].Value != tc.value || events[1].Kind != 'E' || events[1].CommandLine != tc.value {
				t.Errorf("%s, %s: events %+v, want P Cwd and E of %q", locale, tc.name, events, tc.value)
			}
		}
	}
}

// TestLauncherTakesOnlyANonce: the launcher reads one line, with echo off,
// as the nonce; a line that is none (input a client typed before a late
// ask) leaves the shell without a nonce (no command detection) and is not
// run, inside the rc file or anywhere else.
func TestLauncherTakesOnlyANonce(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash here")
	}
	for _, tc := range []struct{ name, typed, want string }{
		{"a nonce", "0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"},
		{"a client's line", "x; echo INJ''ECTED", "-"},
		{"an empty line", "", "-"},
	} {
		ptm, pts, err := console.OpenPTY()
		if err != nil {
			t.Skip(err)
		}
		cmd := exec.Command("sh", "-c", shellLauncher)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "TERM=dumb", "SANDBOXD_SHELL_INTEGRATION=" + ShellIntegration}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pts.Close()
		var mu sync.Mutex
		var out []byte
		go func() {
			buf := make([]byte, 4096)
			for {
				n, err := ptm.Read(buf)
				mu.Lock()
				out = append(out, buf[:n]...)
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
		waitFor := func(what string) {
			t.Helper()
			deadline := time.Now().Add(20 * time.Second)
			for {
				mu.Lock()
				ok := strings.Contains(string(out), what)
				mu.Unlock()
				if ok {
					return
				}
				if time.Now().After(deadline) {
					mu.Lock()
					defer mu.Unlock()
					t.Fatalf("%s: no %q in %q", tc.name, what, out)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		waitFor("\x1b]633;R;nonce\a")
		io.WriteString(ptm, tc.typed+"\n")
		waitFor("\x1b]633;R;ready\a")
		io.WriteString(ptm, "echo \"n=[$__sbx_nonce]\"; exit\n")
		waitFor("n=[" + tc.want + "]")
		cmd.Process.Kill()
		cmd.Wait()
		ptm.Close()
		mu.Lock()
		if strings.Contains(string(out), "INJECTED") {
			t.Errorf("%s: the typed line ran: %q", tc.name, out)
		}
		mu.Unlock()
	}
}
