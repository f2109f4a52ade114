package acp

import "github.com/sandboxd/sandboxd/sandbox"

// CreateTerminalResponse is the result of terminal/create.
type CreateTerminalResponse struct {
	TerminalID string `json:"terminalId"`
}

// ExitStatus is the flat {exitCode, signal} of terminal/wait_for_exit and
// of terminal/output's exitStatus. Both members are always present, one of
// them null.
type ExitStatus struct {
	ExitCode *int    `json:"exitCode"`
	Signal   *string `json:"signal"`
}

// TerminalOutputResponse is the result of terminal/output.
type TerminalOutputResponse struct {
	Output     string      `json:"output"`
	Truncated  bool        `json:"truncated"`
	ExitStatus *ExitStatus `json:"exitStatus,omitempty"`
}

// SessionOpenResponse is the result of _sandboxd/session/open.
type SessionOpenResponse struct {
	SessionID string `json:"sessionId"`
	Container string `json:"container"`
	Workspace string `json:"workspace"`
	Cwd       string `json:"cwd"`
	User      string `json:"user"`
	CPUs      string `json:"cpus"`
	Memory    string `json:"memory"`
	Pids      int64  `json:"pids"`
}

func exitStatus(st sandbox.ExitStatus) ExitStatus {
	return ExitStatus{ExitCode: st.ExitCode, Signal: st.Signal}
}
