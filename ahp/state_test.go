package ahp

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestReducerFixtures runs every reducer fixture of the AHP specification
// through the reducers the server keeps its state with.
func TestReducerFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/reducers/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var fx struct {
				Reducer  string          `json:"reducer"`
				Initial  json.RawMessage `json:"initial"`
				Actions  []Action        `json:"actions"`
				Expected json.RawMessage `json:"expected"`
			}
			if err := json.Unmarshal(raw, &fx); err != nil {
				t.Fatal(err)
			}
			var got []byte
			switch fx.Reducer {
			case "terminal":
				var s TerminalState
				if err := json.Unmarshal(fx.Initial, &s); err != nil {
					t.Fatal(err)
				}
				for _, a := range fx.Actions {
					s = ReduceTerminal(s, a)
				}
				got, err = json.Marshal(s)
			case "root":
				var s RootState
				if err := json.Unmarshal(fx.Initial, &s); err != nil {
					t.Fatal(err)
				}
				for _, a := range fx.Actions {
					s = ReduceRoot(s, a)
				}
				got, err = json.Marshal(s)
			default:
				t.Fatalf("unknown reducer %q", fx.Reducer)
			}
			if err != nil {
				t.Fatal(err)
			}
			var g, w any
			json.Unmarshal(got, &g)
			json.Unmarshal(fx.Expected, &w)
			if !reflect.DeepEqual(g, w) {
				t.Errorf("state\n got %s\nwant %s", got, fx.Expected)
			}
		})
	}
}

func TestTrimContent(t *testing.T) {
	code := 0
	tests := []struct {
		name    string
		content []ContentPart
		max     int
		want    []ContentPart
	}{
		{"fits", []ContentPart{{Type: "unclassified", Value: "abc"}}, 3 + PartOverhead, []ContentPart{{Type: "unclassified", Value: "abc"}}},
		{"head of one part", []ContentPart{{Type: "unclassified", Value: "abcdef"}}, 4 + PartOverhead, []ContentPart{{Type: "unclassified", Value: "cdef"}}},
		{"whole old parts go first", []ContentPart{
			{Type: "unclassified", Value: "$ "},
			{Type: "command", CommandID: "1", Output: "hello\n", IsComplete: true, ExitCode: &code},
			{Type: "unclassified", Value: "$ "},
		}, 4 + 2*PartOverhead, []ContentPart{{Type: "command", CommandID: "1", Output: "o\n", IsComplete: true, ExitCode: &code}, {Type: "unclassified", Value: "$ "}}},
		{"command lines count", []ContentPart{
			{Type: "command", CommandID: "1", CommandLine: "make", Output: "ok\n", IsComplete: true, ExitCode: &code},
			{Type: "unclassified", Value: "$ "},
		}, 8 + 2*PartOverhead, []ContentPart{{Type: "command", CommandID: "1", CommandLine: "make", Output: "k\n", IsComplete: true, ExitCode: &code}, {Type: "unclassified", Value: "$ "}}},
		{"parts without text count", []ContentPart{
			{Type: "command", CommandID: "1", IsComplete: true, ExitCode: &code},
			{Type: "command", CommandID: "2", IsComplete: true, ExitCode: &code},
			{Type: "command", CommandID: "3"},
		}, 2 * PartOverhead, []ContentPart{{Type: "command", CommandID: "2", IsComplete: true, ExitCode: &code}, {Type: "command", CommandID: "3"}}},
		{"running command keeps its metadata", []ContentPart{{Type: "command", CommandID: "2", CommandLine: "yes", Output: "yyyyyyyy"}}, 6 + PartOverhead,
			[]ContentPart{{Type: "command", CommandID: "2", CommandLine: "yes", Output: "yyy"}}},
		{"running command alone over the cap", []ContentPart{{Type: "command", CommandID: "2", CommandLine: "yes", Output: "yyyyyyyy"}}, 1,
			[]ContentPart{{Type: "command", CommandID: "2", CommandLine: "yes", Output: ""}}},
		{"cut moves to a rune boundary", []ContentPart{{Type: "unclassified", Value: "ab✓cd"}}, 4 + PartOverhead, []ContentPart{{Type: "unclassified", Value: "cd"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := TerminalState{Content: tc.content}
			TrimContent(&s, tc.max)
			if !reflect.DeepEqual(s.Content, tc.want) {
				t.Errorf("content = %+v, want %+v", s.Content, tc.want)
			}
		})
	}
}

func TestTrimContentKeepsTerminalsBounded(t *testing.T) {
	const max = 64 << 10
	s := TerminalState{Content: []ContentPart{}}
	chunk := strings.Repeat("héllo ✓ ", 1000)
	for i := range 2000 {
		s = ReduceTerminal(s, Action{Type: "terminal/data", Data: chunk})
		if i%100 == 0 {
			s = ReduceTerminal(s, Action{Type: "terminal/commandExecuted", CommandID: "c", CommandLine: "x"})
		}
		TrimContent(&s, max)
	}
	total := 0
	for _, p := range s.Content {
		total += partSize(p)
		if !utf8.ValidString(p.text()) {
			t.Fatalf("trimmed text is not valid UTF-8")
		}
	}
	if total > max {
		t.Errorf("content holds %d bytes, cap %d", total, max)
	}
}
