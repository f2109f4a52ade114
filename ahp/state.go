package ahp

import (
	"encoding/json"
	"unicode/utf8"
)

// Claim says who holds a terminal: a client (ClientID) or a session
// (Session, optionally narrowed to a turn and tool call).
type Claim struct {
	Kind       string `json:"kind"` // "client" or "session"
	ClientID   string `json:"clientId,omitempty"`
	Session    string `json:"session,omitempty"`
	TurnID     string `json:"turnId,omitempty"`
	ToolCallID string `json:"toolCallId,omitempty"`
}

// ContentPart is one part of a terminal's content: unclassified output, or
// a command with its output.
type ContentPart struct {
	Type string // "unclassified" or "command"
	// Value is the output of an unclassified part.
	Value string
	// The rest describe a command part.
	CommandID   string
	CommandLine string
	Output      string
	Timestamp   int64
	IsComplete  bool
	ExitCode    *int
	DurationMs  *int64
}

// MarshalJSON writes the fields of the part's type, as the schema has them.
func (p ContentPart) MarshalJSON() ([]byte, error) {
	if p.Type != "command" {
		return json.Marshal(struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		}{"unclassified", p.Value})
	}
	return json.Marshal(struct {
		Type        string `json:"type"`
		CommandID   string `json:"commandId"`
		CommandLine string `json:"commandLine"`
		Output      string `json:"output"`
		Timestamp   int64  `json:"timestamp"`
		IsComplete  bool   `json:"isComplete"`
		ExitCode    *int   `json:"exitCode,omitempty"`
		DurationMs  *int64 `json:"durationMs,omitempty"`
	}{p.Type, p.CommandID, p.CommandLine, p.Output, p.Timestamp, p.IsComplete, p.ExitCode, p.DurationMs})
}

// UnmarshalJSON reads either kind of part.
func (p *ContentPart) UnmarshalJSON(b []byte) error {
	var v struct {
		Type        string `json:"type"`
		Value       string `json:"value"`
		CommandID   string `json:"commandId"`
		CommandLine string `json:"commandLine"`
		Output      string `json:"output"`
		Timestamp   int64  `json:"timestamp"`
		IsComplete  bool   `json:"isComplete"`
		ExitCode    *int   `json:"exitCode"`
		DurationMs  *int64 `json:"durationMs"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*p = ContentPart{Type: v.Type, Value: v.Value, CommandID: v.CommandID, CommandLine: v.CommandLine, Output: v.Output,
		Timestamp: v.Timestamp, IsComplete: v.IsComplete, ExitCode: v.ExitCode, DurationMs: v.DurationMs}
	return nil
}

func (p ContentPart) text() string {
	if p.Type == "command" {
		return p.Output
	}
	return p.Value
}

// TerminalState is the full state of one terminal channel.
type TerminalState struct {
	Title                    string        `json:"title"`
	Cwd                      string        `json:"cwd,omitempty"`
	Cols                     int           `json:"cols,omitempty"`
	Rows                     int           `json:"rows,omitempty"`
	Content                  []ContentPart `json:"content"`
	ExitCode                 *int          `json:"exitCode,omitempty"`
	Claim                    Claim         `json:"claim"`
	SupportsCommandDetection bool          `json:"supportsCommandDetection,omitempty"`
}

// TerminalInfo is a terminal's entry in the root channel's catalogue.
type TerminalInfo struct {
	Resource string `json:"resource"`
	Title    string `json:"title"`
	Claim    Claim  `json:"claim"`
	ExitCode *int   `json:"exitCode,omitempty"`
}

// RootState is the root channel's state. sandboxd serves terminals only:
// agents is always empty, other root fields pass through untouched.
type RootState struct {
	Agents         json.RawMessage `json:"agents"`
	ActiveSessions json.RawMessage `json:"activeSessions,omitempty"`
	Terminals      []TerminalInfo  `json:"terminals,omitempty"`
	Config         json.RawMessage `json:"config,omitempty"`
}

// Action is a state change of the terminal or root channel. Only the fields
// of its Type are set.
type Action struct {
	Type        string         `json:"type"`
	Data        string         `json:"data,omitempty"`
	Cols        int            `json:"cols,omitempty"`
	Rows        int            `json:"rows,omitempty"`
	Claim       *Claim         `json:"claim,omitempty"`
	Title       string         `json:"title,omitempty"`
	Cwd         string         `json:"cwd,omitempty"`
	ExitCode    *int           `json:"exitCode,omitempty"`
	CommandID   string         `json:"commandId,omitempty"`
	CommandLine string         `json:"commandLine,omitempty"`
	Timestamp   int64          `json:"timestamp,omitempty"`
	DurationMs  *int64         `json:"durationMs,omitempty"`
	Terminals   []TerminalInfo `json:"terminals,omitempty"`
}

// size is about the memory an action holds: its strings, and a fixed
// amount for the rest.
func (a Action) size() int {
	const fixed = 64
	n := fixed + len(a.Data) + len(a.Title) + len(a.Cwd) + len(a.CommandID) + len(a.CommandLine)
	if a.Claim != nil {
		n += a.Claim.size()
	}
	for _, t := range a.Terminals {
		n += fixed + len(t.Resource) + len(t.Title) + t.Claim.size()
	}
	return n
}

func (c Claim) size() int {
	return len(c.Kind) + len(c.ClientID) + len(c.Session) + len(c.TurnID) + len(c.ToolCallID)
}

// MarshalJSON keeps fields the schema requires even when they are zero:
// the data of terminal/data and terminal/input, and the terminal list.
func (a Action) MarshalJSON() ([]byte, error) {
	type plain Action
	b, err := json.Marshal(plain(a))
	if err != nil {
		return nil, err
	}
	var extra map[string]any
	switch a.Type {
	case "terminal/data", "terminal/input":
		if a.Data == "" {
			extra = map[string]any{"data": ""}
		}
	case "root/terminalsChanged":
		if len(a.Terminals) == 0 {
			extra = map[string]any{"terminals": []TerminalInfo{}}
		}
	case "terminal/titleChanged":
		if a.Title == "" {
			extra = map[string]any{"title": ""}
		}
	case "terminal/commandExecuted":
		if a.CommandLine == "" {
			extra = map[string]any{"commandLine": ""}
		}
	}
	if extra == nil {
		return b, nil
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for k, v := range extra {
		m[k] = v
	}
	return json.Marshal(m)
}

// ReduceTerminal applies an action to a terminal's state. Unknown actions
// change nothing; terminal/input is a side effect for the server, not state.
func ReduceTerminal(s TerminalState, a Action) TerminalState {
	s.Content = append([]ContentPart(nil), s.Content...)
	reduceTerminal(&s, a)
	return s
}

// reduceTerminal is ReduceTerminal in place, for the server, which owns
// its states: a copy of the content per action would cost a terminal with
// many parts time in proportion to them, under the server's lock.
func reduceTerminal(s *TerminalState, a Action) {
	switch a.Type {
	case "terminal/data":
		n := len(s.Content)
		switch {
		case n > 0 && s.Content[n-1].Type == "command" && !s.Content[n-1].IsComplete:
			s.Content[n-1].Output += a.Data
		case n > 0 && s.Content[n-1].Type == "unclassified":
			s.Content[n-1].Value += a.Data
		default:
			s.Content = append(s.Content, ContentPart{Type: "unclassified", Value: a.Data})
		}
	case "terminal/resized":
		s.Cols, s.Rows = a.Cols, a.Rows
	case "terminal/claimed":
		if a.Claim != nil {
			s.Claim = *a.Claim
		}
	case "terminal/titleChanged":
		s.Title = a.Title
	case "terminal/cwdChanged":
		s.Cwd = a.Cwd
	case "terminal/exited":
		s.ExitCode = a.ExitCode
	case "terminal/cleared":
		s.Content = []ContentPart{}
	case "terminal/commandDetectionAvailable":
		s.SupportsCommandDetection = true
	case "terminal/commandExecuted":
		s.SupportsCommandDetection = true
		s.Content = append(s.Content, ContentPart{Type: "command", CommandID: a.CommandID, CommandLine: a.CommandLine, Timestamp: a.Timestamp})
	case "terminal/commandFinished":
		for i := len(s.Content) - 1; i >= 0; i-- {
			if p := &s.Content[i]; p.Type == "command" && p.CommandID == a.CommandID {
				p.IsComplete, p.ExitCode, p.DurationMs = true, a.ExitCode, a.DurationMs
				break
			}
		}
	}
	if s.Content == nil {
		s.Content = []ContentPart{}
	}
}

// ReduceRoot applies an action to the root state.
func ReduceRoot(s RootState, a Action) RootState {
	if a.Type == "root/terminalsChanged" {
		s.Terminals = append([]TerminalInfo{}, a.Terminals...)
	}
	return s
}

// PartOverhead is what a content part counts against a terminal's cap
// beyond its text and command line, so that parts with no output (a flood
// of short commands) cannot grow a terminal without bound either.
const PartOverhead = 64

func partSize(p ContentPart) int { return len(p.text()) + len(p.CommandLine) + PartOverhead }

// TrimContent drops the oldest content until all parts fit in max bytes,
// each counted as its text, its command line and PartOverhead: whole parts
// first, then the head of the oldest one's text, cut forward to a UTF-8
// boundary. A command part keeps its metadata even when its output goes.
func TrimContent(s *TerminalState, max int) {
	total := 0
	for _, p := range s.Content {
		total += partSize(p)
	}
	for total > max && len(s.Content) > 0 {
		p := &s.Content[0]
		text := p.text()
		over := total - max
		if over >= len(text) && (p.Type != "command" || p.IsComplete || len(s.Content) > 1) {
			total -= partSize(*p)
			s.Content = s.Content[1:]
			continue
		}
		cut := min(over, len(text))
		for cut < len(text) && !utf8.RuneStart(text[cut]) {
			cut++
		}
		total -= cut
		if p.Type == "command" {
			p.Output = text[cut:]
		} else {
			p.Value = text[cut:]
		}
		break
	}
}
