package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// detected is a command as a client that follows a terminal's actions
// sees it: its line, the data that went into its part, its end.
type detected struct {
	id, line string
	output   string
	finished bool
	exitCode *int
}

func (d detected) String() string {
	end := "running"
	switch {
	case d.finished && d.exitCode != nil:
		end = fmt.Sprintf("exit code %d", *d.exitCode)
	case d.finished:
		end = "no exit code"
	}
	return fmt.Sprintf("%q (output %q, %s)", d.line, d.output, end)
}

// commands reads the commands of channel from the actions, as the
// terminal reducer builds its command parts.
func (c *ahpClient) commands(channel string) []detected {
	var cmds []detected
	open := -1
	for _, e := range c.envelopes() {
		if e.Channel != channel || e.RejectionReason != "" {
			continue
		}
		switch e.Action.Type {
		case "terminal/commandExecuted":
			cmds = append(cmds, detected{id: e.Action.CommandID, line: e.Action.CommandLine})
			open = len(cmds) - 1
		case "terminal/data":
			if open >= 0 {
				cmds[open].output += e.Action.Data
			}
		case "terminal/commandFinished":
			if open >= 0 && cmds[open].id == e.Action.CommandID {
				cmds[open].finished, cmds[open].exitCode = true, e.Action.ExitCode
			}
			open = -1
		}
	}
	return cmds
}

// finished counts the commands of channel that finished.
func (c *ahpClient) finished(channel string) int {
	n := 0
	for _, cmd := range c.commands(channel) {
		if cmd.finished {
			n++
		}
	}
	return n
}

// cwds lists the directories the server told for channel.
func (c *ahpClient) cwds(channel string) []string {
	var dirs []string
	for _, e := range c.envelopes() {
		if e.Channel == channel && e.Action.Type == "terminal/cwdChanged" {
			dirs = append(dirs, e.Action.Cwd)
		}
	}
	return dirs
}

// TestAHPDetectsEveryCommandLine: every command line the shell runs gets
// its command part, with its output in it, and its exit code, whatever the
// line starts with (a subshell, which bash's DEBUG trap missed), also one
// typed over several lines; an empty line and Ctrl-C at the prompt run
// nothing and get no part; a cd in a subshell changes no directory.
func TestAHPDetectsEveryCommandLine(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	const term = "ahp-terminal:/detect"
	c := subscribedTerminal(t, a, "client-d", term, ws)
	eventually(t, "prompt", time.Minute, func() bool { return strings.Contains(c.data(term), "$ ") })
	type want struct {
		line, output string
		exitCode     int
	}
	var wants []want
	for i, step := range []struct {
		typed string
		want  *want // nil: no command
	}{
		{"(exit 5)\r", &want{"(exit 5)", "", 5}},
		{"(echo sub)\r", &want{"(echo sub)", "sub\r\n", 0}},
		{"(cd / && false)\r", &want{"(cd / && false)", "", 1}},
		{"true; (exit 4)\r", &want{"true; (exit 4)", "", 4}},
		{"\r", nil},
		{"for i in 1 2\rdo echo i$i\rdone\r", &want{"for i in 1 2; do echo i$i; done", "i1\r\ni2\r\n", 0}},
		{"\x03", nil},
		{"{ echo g; (exit 6); }\r", &want{"{ echo g; (exit 6); }", "g\r\n", 6}},
		{"cd /tmp\r", &want{"cd /tmp", "", 0}},
	} {
		prompts := strings.Count(c.data(term), "$ ")
		c.input(term, step.typed, i+1)
		if step.want != nil {
			wants = append(wants, *step.want)
		}
		// The shell integration's D comes before the prompt.
		eventually(t, "the prompt after "+step.typed, time.Minute, func() bool { return strings.Count(c.data(term), "$ ") > prompts })
	}
	got := c.commands(term)
	if len(got) != len(wants) {
		t.Fatalf("%d commands detected, want %d: %v", len(got), len(wants), got)
	}
	for i, w := range wants {
		g := got[i]
		if g.line != w.line || g.output != w.output || !g.finished || g.exitCode == nil || *g.exitCode != w.exitCode {
			t.Errorf("command %d: %v; want %q (output %q, exit code %d)", i, g, w.line, w.output, w.exitCode)
		}
	}
	if dirs := c.cwds(term); len(dirs) != 1 || dirs[0] != "file:///tmp" {
		t.Errorf("cwdChanged %q, want only file:///tmp (the subshell's cd changes nothing)", dirs)
	}

	// The server's own state has the same parts.
	r := c.call("subscribe", map[string]any{"channel": term})
	var snap struct {
		Snapshot struct {
			State struct {
				Content []struct {
					Type        string `json:"type"`
					CommandLine string `json:"commandLine"`
					Output      string `json:"output"`
					IsComplete  bool   `json:"isComplete"`
					ExitCode    *int   `json:"exitCode"`
				} `json:"content"`
			} `json:"state"`
		} `json:"snapshot"`
	}
	if err := json.Unmarshal(r.Result, &snap); err != nil {
		t.Fatal(err)
	}
	var parts []want
	for _, p := range snap.Snapshot.State.Content {
		if p.Type == "command" && p.IsComplete && p.ExitCode != nil {
			parts = append(parts, want{p.CommandLine, p.Output, *p.ExitCode})
		}
	}
	if len(parts) != len(wants) {
		t.Fatalf("the state's complete command parts: %+v, want %+v", parts, wants)
	}
	for i := range wants {
		if parts[i] != wants[i] {
			t.Errorf("the state's command part %d: %+v, want %+v", i, parts[i], wants[i])
		}
	}
}

// forgeScript, run as `sh forge.sh PID CODE DIR`, is a hostile command
// that reads the memory of the shell PID (a process of its own user),
// takes every nonce-shaped string in it and writes, into that shell's
// terminal, a D with exit code CODE and a P with directory DIR signed with
// each.
const forgeScript = `p=$1
for n in $(grep ' rw-p ' /proc/$p/maps | while read range rest; do
	s=$((0x${range%-*})); e=$((0x${range#*-}))
	dd if=/proc/$p/mem bs=4096 skip=$((s / 4096)) count=$(((e - s) / 4096)) 2>/dev/null
done | tr -c '0-9a-f' '\n' | grep -xE '[0-9a-f]{32}' | sort -u); do
	printf '\033]633;D;%s;%s\007\033]633;P;Cwd=%s;%s\007' "$2" "$n" "$3" "$n" >/proc/$p/fd/1
done
`

// TestAHPCommandDetectionBoundary checks what docs/ahp.md says command
// detection guarantees. Output that carries OSC 633 sequences without the
// terminal's nonce (a file a command wrote, printed) is stripped and
// becomes nothing: the command keeps its own exit code and directory. A
// command that reads its shell's memory takes the nonce, and forges the
// end and directory of its own terminal and of another terminal of the
// same container: detection is a display aid, not proof against the
// session's own commands.
func TestAHPCommandDetectionBoundary(t *testing.T) {
	ws := workspace(t)
	const wrong = "0123456789abcdef0123456789abcdef"
	writeFile(t, filepath.Join(ws, "forged.txt"), "a\x1b]633;D;0\a"+
		"b\x1b]633;P;Cwd=/forged\a"+
		"c\x1b]633;D;0;"+wrong+"\a"+
		"d\x1b]633;P;Cwd=/forged;"+wrong+"\a"+
		"e\x1b]633;E;rm -rf /;"+wrong+"\a\x1b]633;C;"+wrong+"\a"+
		"f\u009d633;D;0;"+wrong+"\u009c"+
		"g\x1b]633;D;0;;\a\n")
	writeFile(t, filepath.Join(ws, "forge.sh"), forgeScript)
	a := startAHP(t, ws)
	const one, two = "ahp-terminal:/one", "ahp-terminal:/two"
	c := subscribedTerminal(t, a, "client-one", one, ws)
	eventually(t, "prompt", time.Minute, func() bool { return strings.Contains(c.data(one), "$ ") })

	c.input(one, "cat forged.txt; (exit 7)\r", 1)
	eventually(t, "cat finished", time.Minute, func() bool { return c.finished(one) == 1 })
	cmds := c.commands(one)
	if len(cmds) != 1 || cmds[0].line != "cat forged.txt; (exit 7)" || cmds[0].exitCode == nil || *cmds[0].exitCode != 7 {
		t.Errorf("commands %v: want the cat alone, with its own exit code 7", cmds)
	}
	if out := cmds[0].output; out != "abcdefg\r\n" {
		t.Errorf("the cat's output = %q, want the text with every forged sequence stripped", out)
	}
	if dirs := c.cwds(one); len(dirs) != 0 {
		t.Errorf("cwdChanged %q from printed sequences", dirs)
	}

	// The limit: a command of the terminal reads the nonce from its shell.
	c.input(one, "sh forge.sh $$ 0 /forged; (exit 9)\r", 2)
	eventually(t, "forged end", time.Minute, func() bool { return c.finished(one) == 2 })
	if cmd := c.commands(one)[1]; cmd.exitCode == nil || *cmd.exitCode != 0 {
		t.Errorf("the forging command: %v; want its end forged, exit code 0 (the docs say a command that reads its shell's memory can)", cmd)
	}
	eventually(t, "forged directory", time.Minute, func() bool { return slices.Contains(c.cwds(one), "file:///forged") })

	// And so does any command in the same container for another terminal.
	d := subscribedTerminal(t, a, "client-two", two, ws)
	d.input(two, "echo $$ >/tmp/two.pid; echo wr''ote; sleep 600\r", 1)
	eventually(t, "the shell's pid written", time.Minute, func() bool { return strings.Contains(d.data(two), "wrote\r\n") })
	c.input(one, "sh forge.sh $(cat /tmp/two.pid) 0 /forged2\r", 3)
	eventually(t, "the other terminal's command forged finished", time.Minute, func() bool {
		return d.finished(two) == 1 && slices.Contains(d.cwds(two), "file:///forged2")
	})
}
