package ahp

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/ahp/osc633"
	"github.com/sandboxd/sandboxd/sandbox"
)

// TestFoldMatchesReducer checks that gathering data and reducing it in one
// go leaves the same state as reducing and trimming action by action.
func TestFoldMatchesReducer(t *testing.T) {
	code := 0
	dur := int64(5)
	for _, tc := range []struct {
		name    string
		max     int
		actions []Action
	}{
		{name: "under the cap", max: 100, actions: []Action{
			{Type: "terminal/data", Data: "$ "},
			{Type: "terminal/data", Data: "ls\r\n"},
		}},
		{name: "over the cap in small pieces", max: 10, actions: []Action{
			{Type: "terminal/data", Data: "abcdef"}, {Type: "terminal/data", Data: "ghijkl"}, {Type: "terminal/data", Data: "mnopqr"},
			{Type: "terminal/data", Data: "stuvwx"},
		}},
		{name: "one piece over the cap", max: 4, actions: []Action{
			{Type: "terminal/data", Data: "0123456789"},
		}},
		{name: "multi-byte characters at the cut", max: 5, actions: []Action{
			{Type: "terminal/data", Data: "ééé"}, {Type: "terminal/data", Data: "€€"}, {Type: "terminal/data", Data: "x€"},
		}},
		{name: "commands", max: 12, actions: []Action{
			{Type: "terminal/data", Data: "$ "},
			{Type: "terminal/commandExecuted", CommandID: "c1", CommandLine: "yes"},
			{Type: "terminal/data", Data: "y\r\ny\r\ny\r\n"}, {Type: "terminal/data", Data: "y\r\ny\r\n"},
			{Type: "terminal/commandFinished", CommandID: "c1", ExitCode: &code, DurationMs: &dur},
			{Type: "terminal/data", Data: "$ "},
			{Type: "terminal/commandExecuted", CommandID: "c2", CommandLine: "cat big"},
			{Type: "terminal/data", Data: strings.Repeat("z", 40)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := TerminalState{Content: []ContentPart{}}
			for _, a := range tc.actions {
				want = ReduceTerminal(want, a)
				TrimContent(&want, tc.max)
			}
			s := testServer(Config{MaxContent: tc.max})
			for _, a := range tc.actions {
				s.emit("ahp-terminal:/t", a, nil)
			}
			s.mu.Lock()
			snap, _ := s.snapshotLocked("ahp-terminal:/t")
			s.mu.Unlock()
			got, _ := json.Marshal(snap.State)
			wantJSON, _ := json.Marshal(want)
			if string(got) != string(wantJSON) {
				t.Errorf("state\n got %s\nwant %s", got, wantJSON)
			}
		})
	}
}

// TestOutputCannotForgeCommands: only the shell integration knows the
// nonce, so a program's output can neither start commands (C, D without
// the E that carries it) nor grow the terminal's state past its cap with
// parts that hold no text.
func TestOutputCannotForgeCommands(t *testing.T) {
	const nonce = "n0nce"
	e := func(line string) string { return "\x1b]633;E;" + line + ";" + nonce + "\x07" }
	const c, d = "\x1b]633;C;" + nonce + "\x07", "\x1b]633;D;0;" + nonce + "\x07"
	for _, tc := range []struct {
		name     string
		output   string
		max      int
		commands int // commandExecuted actions wanted
		maxParts int
	}{
		{name: "a real command", output: "$ " + e("ls") + c + "a b\r\n" + d + "$ ", max: 1 << 20, commands: 1, maxParts: 3},
		{name: "C without E", output: strings.Repeat(c, 10000), max: 1 << 20, commands: 0, maxParts: 1},
		{name: "C and D after a used E", output: e("ls") + c + strings.Repeat(c+d, 100), max: 1 << 20, commands: 1, maxParts: 1},
		{name: "E with another nonce", output: strings.Repeat("\x1b]633;E;rm -rf /;guess\x07"+c, 100), max: 1 << 20, commands: 0, maxParts: 1},
		{name: "many real commands stay under the cap", output: strings.Repeat(e("true")+c+d, 5000), max: 4096, commands: 5000, maxParts: 4096 / PartOverhead},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{MaxContent: tc.max, ReplayActions: 100000, ReplayBytes: 1 << 30})
			term := s.terms["ahp-terminal:/t"]
			term.parser = osc633.NewParser(nonce)
			term.process([]byte(tc.output), true)
			s.mu.Lock()
			defer s.mu.Unlock()
			commands := 0
			for _, env := range s.replay {
				if env.Action.Type == "terminal/commandExecuted" {
					commands++
				}
			}
			if commands != tc.commands {
				t.Errorf("%d commandExecuted, want %d", commands, tc.commands)
			}
			term.fold(tc.max)
			size := 0
			for _, p := range term.state.Content {
				size += partSize(p)
			}
			if len(term.state.Content) > tc.maxParts || size > tc.max {
				t.Errorf("state holds %d parts, %d bytes; want at most %d parts, %d bytes", len(term.state.Content), size, tc.maxParts, tc.max)
			}
		})
	}
}

// TestACommandWithoutItsEndEndsAtTheNext: a command whose D never came
// (its shell's stdout sent elsewhere, where the prompt's D went) is
// finished, its code unknown, when the next one starts, so that no part
// shows running for ever.
func TestACommandWithoutItsEndEndsAtTheNext(t *testing.T) {
	const nonce = "n0nce"
	e := func(line string) string {
		return "\x1b]633;E;" + line + ";" + nonce + "\x07\x1b]633;C;" + nonce + "\x07"
	}
	s := testServer(Config{MaxContent: 1 << 20, ReplayActions: 1000, ReplayBytes: 1 << 20})
	term := s.terms["ahp-terminal:/t"]
	term.parser = osc633.NewParser(nonce)
	term.process([]byte(e("exec >/dev/null")+"$ "+e("ls")+"a\r\n\x1b]633;D;0;"+nonce+"\x07"), true)
	s.mu.Lock()
	defer s.mu.Unlock()
	var got []string
	for _, env := range s.replay {
		a := env.Action
		switch a.Type {
		case "terminal/commandExecuted":
			got = append(got, "executed "+a.CommandID)
		case "terminal/commandFinished":
			code := "unknown"
			if a.ExitCode != nil {
				code = strconv.Itoa(*a.ExitCode)
			}
			got = append(got, "finished "+a.CommandID+" "+code)
		}
	}
	want := []string{"executed cmd-1", "finished cmd-1 unknown", "executed cmd-2", "finished cmd-2 0"}
	if !slices.Equal(got, want) {
		t.Errorf("actions %q, want %q", got, want)
	}
}

// TestSameTitleIsNotSentAgain: a program that sets its title in a loop
// sends each client the list of terminals once per change, not per set.
func TestSameTitleIsNotSentAgain(t *testing.T) {
	s := testServer(Config{ReplayActions: 1000, ReplayBytes: 1 << 20})
	term := s.terms["ahp-terminal:/t"]
	term.parser = osc633.NewParser("n")
	term.process([]byte(strings.Repeat("\x1b]0;building\x07x", 50)+"\x1b]2;done\x07"), true)
	s.mu.Lock()
	defer s.mu.Unlock()
	var titles []string
	for _, env := range s.replay {
		if env.Action.Type == "terminal/titleChanged" {
			titles = append(titles, env.Action.Title)
		}
	}
	if !slices.Equal(titles, []string{"building", "done"}) {
		t.Errorf("titles sent: %q, want building then done", titles)
	}
}

// TestDataActionsAreWhatTheStateHolds: output that a sequence cuts inside
// a character reaches clients as the state holds it: the character whole,
// after the action the sequence made, not two halves each replaced.
func TestDataActionsAreWhatTheStateHolds(t *testing.T) {
	const nonce = "n0nce"
	for _, tc := range []struct {
		name, output, want string
	}{
		{"a prompt mark inside a character", "\xe2\x1b]633;A\x07\x82\xac", "€"},
		{"a command start inside a character", "\x1b]633;E;ls;" + nonce + "\x07\xe2\x82\x1b]633;C;" + nonce + "\x07\xac!", "€!"},
		// A title stays in the data, so the program wrote no character.
		{"a title inside a character", "a\xe2\x1b]0;t\x07\x82\xac", "a\ufffd\x1b]0;t\x07\ufffd\ufffd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{MaxContent: 1 << 20, ReplayActions: 1000, ReplayBytes: 1 << 20})
			term := s.terms["ahp-terminal:/t"]
			term.parser = osc633.NewParser(nonce)
			term.process([]byte(tc.output), true)
			term.fold(1 << 20)
			s.mu.Lock()
			defer s.mu.Unlock()
			// What a client following the actions has: each as JSON.
			var sent strings.Builder
			for _, env := range s.replay {
				if env.Action.Type != "terminal/data" {
					continue
				}
				b, _ := json.Marshal(env.Action)
				var a Action
				json.Unmarshal(b, &a)
				sent.WriteString(a.Data)
			}
			// What a snapshot shows, as JSON.
			var raw strings.Builder
			for _, p := range term.state.Content {
				raw.WriteString(p.Value + p.Output)
			}
			b, _ := json.Marshal(raw.String())
			var held string
			json.Unmarshal(b, &held)
			if sent.String() != tc.want || held != tc.want {
				t.Errorf("clients got %q, a snapshot shows %q; want both %q", sent.String(), held, tc.want)
			}
		})
	}
}

// TestProgramTitlesAreBounded: a title a program sets (OSC 0 or 2) is cut
// to maxTitle at a character, as sent, kept and listed; the same long
// title again is not sent again.
func TestProgramTitlesAreBounded(t *testing.T) {
	for _, tc := range []struct {
		name, title string
		times       int
	}{
		{name: "short", title: "make", times: 1},
		{name: "at the bound", title: strings.Repeat("x", maxTitle), times: 1},
		{name: "long", title: strings.Repeat("x", 60<<10), times: 1},
		{name: "long, cut in a character", title: "x" + strings.Repeat("é", 30<<10), times: 1},
		{name: "long, set again", title: strings.Repeat("€", 20<<10), times: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(Config{ReplayBytes: 1 << 30})
			term := s.terms["ahp-terminal:/t"]
			term.parser = osc633.NewParser("n")
			term.process([]byte(strings.Repeat("\x1b]2;"+tc.title+"\x07", tc.times)), true)
			s.mu.Lock()
			defer s.mu.Unlock()
			var sent, listed []string
			for _, env := range s.replay {
				switch env.Action.Type {
				case "terminal/titleChanged":
					sent = append(sent, env.Action.Title)
				case "root/terminalsChanged":
					for _, info := range env.Action.Terminals {
						listed = append(listed, info.Title)
					}
				}
			}
			if len(sent) != 1 || len(listed) != 1 {
				t.Fatalf("%d titles sent, %d listed; want 1 of each", len(sent), len(listed))
			}
			for _, got := range []string{sent[0], listed[0], term.state.Title} {
				if len(got) > maxTitle || !utf8.ValidString(got) || !strings.HasPrefix(tc.title, got) || len(got) < min(len(tc.title), maxTitle-utf8.UTFMax) {
					t.Errorf("title of %d bytes (valid UTF-8: %v), want the title's head, at most %d bytes", len(got), utf8.ValidString(got), maxTitle)
				}
			}
		})
	}
}

// TestOutputOfARemovedTerminal: output of a terminal that is no longer
// served (read while its processes are killed) reaches neither the
// terminal made again under its URI nor its clients.
func TestOutputOfARemovedTerminal(t *testing.T) {
	s := testServer(Config{})
	old := s.terms["ahp-terminal:/t"]
	old.parser = osc633.NewParser("n")
	s.mu.Lock()
	s.removeLocked(old)
	remade := &terminal{uri: old.uri, s: s, t: &sandbox.Terminal{}, since: s.seq, state: TerminalState{Content: []ContentPart{}}}
	s.terms[old.uri] = remade
	seq := s.seq
	s.mu.Unlock()
	old.process([]byte("late output\x1b]633;A\x07"), true)
	s.mu.Lock()
	defer s.mu.Unlock()
	remade.fold(1 << 20)
	if len(remade.state.Content) != 0 || remade.state.SupportsCommandDetection || s.seq != seq {
		t.Errorf("the old terminal's output reached the new one: %+v, %d actions", remade.state, s.seq-seq)
	}
}
