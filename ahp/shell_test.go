package ahp

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
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
			script := ShellIntegration + "\n__sbx_nonce=" + nonce + "\n__sbx_esc \"$1\"\nprintf '\\033]633;P;Cwd=%s;%s\\007\\033]633;E;%s;%s\\007' \"$__sbx_escaped\" \"$__sbx_nonce\" \"$__sbx_escaped\" \"$__sbx_nonce\"\n"
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

// ptyProgram is a program run on a PTY of its own, as the shell of a
// terminal is, with what it printed gathered.
type ptyProgram struct {
	t   *testing.T
	ptm *os.File
	mu  sync.Mutex
	out []byte
}

// startPTY starts the launcher on a new PTY, with the shell integration as
// a terminal's exec has it.
func startPTY(t *testing.T) *ptyProgram {
	t.Helper()
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
	p := &ptyProgram{t: t, ptm: ptm}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := ptm.Read(buf)
			p.mu.Lock()
			p.out = append(p.out, buf[:n]...)
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		ptm.Close()
		<-done
	})
	return p
}

// output returns what the program printed so far.
func (p *ptyProgram) output() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.out...)
}

// waitUntil waits until what the program printed satisfies cond.
func (p *ptyProgram) waitUntil(what string, cond func(out string) bool) {
	p.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond(string(p.output())) {
		if time.Now().After(deadline) {
			p.t.Fatalf("no %s in %q", what, p.output())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitFor waits until the program printed what, n times in all.
func (p *ptyProgram) waitFor(what string, n int) {
	p.t.Helper()
	p.waitUntil(fmt.Sprintf("%d x %q", n, what), func(out string) bool { return strings.Count(out, what) >= n })
}

// waitPrompt waits for the shell integration's nth prompt, shown whole.
func (p *ptyProgram) waitPrompt(n int) {
	p.t.Helper()
	const end, d = "\x1b]633;B\a", "\x1b]633;P;Cwd="
	p.waitUntil(fmt.Sprintf("prompt %d", n), func(out string) bool {
		return strings.Count(out, d) >= n && strings.LastIndex(out, end) > strings.LastIndex(out, d)
	})
}

func (p *ptyProgram) typeIn(s string) {
	p.t.Helper()
	if _, err := io.WriteString(p.ptm, s); err != nil {
		p.t.Fatal(err)
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
		t.Run(tc.name, func(t *testing.T) {
			p := startPTY(t)
			p.waitFor("\x1b]633;R;nonce\a", 1)
			p.typeIn(tc.typed + "\n")
			p.waitFor("\x1b]633;R;ready\a", 1)
			p.typeIn("echo \"n=[$__sbx_nonce]\"; exit\n")
			p.waitFor("n=["+tc.want+"]", 1)
			if strings.Contains(string(p.output()), "INJECTED") {
				t.Errorf("the typed line ran: %q", p.output())
			}
		})
	}
}

// shellCommand is a command as the shell integration's sequences show it.
type shellCommand struct {
	line     string
	exitCode int
	output   string
}

func (c shellCommand) String() string {
	return fmt.Sprintf("%.200q: exit %d, output %q", c.line, c.exitCode, c.output)
}

// commandsIn reads the commands that output shows: each E and C with the
// data up to its D.
func commandsIn(t *testing.T, nonce string, output []byte) []shellCommand {
	t.Helper()
	data, events := osc633.NewParser(nonce).Feed(output)
	var cmds []shellCommand
	var line string
	from := -1
	for _, ev := range events {
		switch ev.Kind {
		case 'E':
			line = ev.CommandLine
		case 'C':
			if from >= 0 {
				t.Errorf("%q started while %q ran", line, cmds[len(cmds)-1].line)
			}
			cmds = append(cmds, shellCommand{line: line})
			from = ev.Offset
		case 'D':
			if from < 0 {
				continue // a prompt after no command
			}
			if ev.ExitCode == nil {
				t.Fatalf("D of %q without an exit code", line)
			}
			cmds[len(cmds)-1].exitCode = *ev.ExitCode
			cmds[len(cmds)-1].output = string(data[from:ev.Offset])
			from = -1
		}
	}
	return cmds
}

// TestShellIntegrationMarksEveryCommandLine: every command line the shell
// runs, whatever it starts with, gets its E and C before its output and
// its exit code in a D after it; an empty line, Ctrl-C at the prompt and
// a comment run nothing and get none.
func TestShellIntegrationMarksEveryCommandLine(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash here")
	}
	const nonce = "0123456789abcdef0123456789abcdef"
	p := startPTY(t)
	p.waitFor("\x1b]633;R;nonce\a", 1)
	p.typeIn(nonce + "\n")
	p.waitPrompt(1)
	long := ": " + strings.Repeat("x", 70<<10)
	prompts := 1
	for _, lines := range [][]string{
		{"(exit 5)"},
		{"(echo sub)"},
		{"(cd / && false)"},
		{"true; (exit 4)"},
		{""},
		{"for i in 1 2", "do echo i$i", "done"},
		{"{ echo g; false; }"},
		{"true | (exit 3)"},
		{"cat <<EOF", "here", "EOF"},
		{"\x03"},
		{"# a comment"},
		{"sleep 0 &"},
		{long},
		{"cd /"},
	} {
		for i, l := range lines {
			if l != "\x03" {
				l += "\r"
			}
			asked := strings.Count(string(p.output()), "\n> ")
			p.typeIn(l)
			if i < len(lines)-1 {
				// The next line once bash asks for it (PS2).
				p.waitFor("\n> ", asked+1)
			}
		}
		prompts++
		p.waitPrompt(prompts)
	}
	want := []shellCommand{
		{"(exit 5)", 5, ""},
		{"(echo sub)", 0, "sub\r\n"},
		{"(cd / && false)", 1, ""},
		{"true; (exit 4)", 4, ""},
		{"for i in 1 2; do echo i$i; done", 0, "i1\r\ni2\r\n"},
		{"{ echo g; false; }", 1, "g\r\n"},
		{"true | (exit 3)", 3, ""},
		{"cat <<EOF\nhere\nEOF", 0, "here\r\n"},
		{"sleep 0 &", 0, ""},
		{long[:4096], 0, ""},
		{"cd /", 0, ""},
	}
	got := commandsIn(t, nonce, p.output())
	if len(got) != len(want) {
		t.Fatalf("%d commands %v, want %d", len(got), got, len(want))
	}
	for i, w := range want {
		g := got[i]
		// A background job's number and pid, and its end, are bash's
		// notices, in whichever part they come.
		if w.line == "sleep 0 &" {
			g.output = regexp.MustCompile(`\[1\][ +][^\n]*\n`).ReplaceAllString(g.output, "")
		}
		if g != w {
			t.Errorf("command %d = %v, want %v", i, g, w)
		}
	}
	// The directory is told at each prompt: after the cd, the new one.
	_, events := osc633.NewParser(nonce).Feed(p.output())
	var cwds []string
	for _, ev := range events {
		if ev.Kind == 'P' && ev.Key == "Cwd" {
			cwds = append(cwds, ev.Value)
		}
	}
	if len(cwds) != prompts || cwds[len(cwds)-1] != "/" || cwds[len(cwds)-2] == "/" {
		t.Errorf("directories told: %q, want one per prompt, / only after the cd", cwds)
	}
}
