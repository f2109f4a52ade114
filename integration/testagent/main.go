// Command testagent is a small ACP agent, built on the independent
// acp-go-sdk, that the wrap tests put behind sandboxd. It runs commands
// through client terminals, embeds them in tool calls, and reports what it
// saw as agent messages:
//
//	caps          the clientCapabilities it was given, as JSON
//	run LINE      runs LINE in a terminal embedded in a tool call, then
//	              reports "exit=... output=..."
//	elsewhere LINE  runs LINE in a session id the agent made up, which the
//	              editor never opened, and reports like run
//	crash LINE    starts LINE in a terminal and exits with code 3
//	quit N        says "bye" and exits with code N at once
//	garbage       writes a line that is not JSON to stdout, then says "ok"
//	permission    asks for permission and reports the chosen option
//	read PATH     reads a file through the client and reports it
//	exec LINE     runs LINE itself (sh -c, os/exec) in the session's cwd,
//	              as agents with a shell tool of their own do, shows it as
//	              a tool call of kind execute with its output as text,
//	              and reports "exit=... output=..."
//	get URL       GETs URL through the proxy HTTP_PROXY names (also for
//	              localhost), reporting "status=... body=..."
//	dial ADDR     opens a TCP connection to ADDR itself, bypassing any
//	              proxy, and reports "dial: ok" or the error
//	lookup NAME   looks NAME up itself and reports the addresses or the
//	              error
//	download HOST:PORT  reads all a server sends through a CONNECT of the
//	              proxy HTTPS_PROXY names, reporting "bytes=... ns=..."
//
// Anything else is echoed back. With TESTAGENT_TRANSCRIPT=PREFIX set, it
// records the bytes it reads in PREFIX.in and those it writes in
// PREFIX.out, for tests that check what the relay passed on.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	acp "github.com/coder/acp-go-sdk"
)

type agent struct {
	acp.Agent // methods the tests never call
	conn      *acp.AgentSideConnection
	ready     chan struct{} // closed once conn is set: the SDK reads before it returns it
	stdout    io.Writer

	mu       sync.Mutex
	caps     acp.ClientCapabilities
	sessions map[string]string // id -> cwd
}

func (a *agent) Initialize(_ context.Context, p acp.InitializeRequest) (acp.InitializeResponse, error) {
	a.mu.Lock()
	a.caps = p.ClientCapabilities
	a.mu.Unlock()
	return acp.InitializeResponse{
		ProtocolVersion:   acp.ProtocolVersionNumber,
		AgentCapabilities: acp.AgentCapabilities{LoadSession: true},
	}, nil
}

func (a *agent) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

func (a *agent) NewSession(_ context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	b := make([]byte, 6)
	rand.Read(b)
	id := "sess_" + hex.EncodeToString(b)
	a.mu.Lock()
	a.sessions[id] = p.Cwd
	a.mu.Unlock()
	return acp.NewSessionResponse{SessionId: acp.SessionId(id)}, nil
}

func (a *agent) LoadSession(_ context.Context, p acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	a.mu.Lock()
	a.sessions[string(p.SessionId)] = p.Cwd
	a.mu.Unlock()
	return acp.LoadSessionResponse{}, nil
}

func (a *agent) CloseSession(_ context.Context, p acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	a.mu.Lock()
	delete(a.sessions, string(p.SessionId))
	a.mu.Unlock()
	return acp.CloseSessionResponse{}, nil
}

func (a *agent) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, nil
}

func (a *agent) Cancel(context.Context, acp.CancelNotification) error { return nil }

func (a *agent) say(ctx context.Context, sid acp.SessionId, text string) error {
	return a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.UpdateAgentMessageText(text)})
}

func (a *agent) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	<-a.ready
	var text string
	for _, b := range p.Prompt {
		if b.Text != nil {
			text += b.Text.Text
		}
	}
	verb, arg, _ := strings.Cut(text, " ")
	a.mu.Lock()
	cwd := a.sessions[string(p.SessionId)]
	caps := a.caps
	a.mu.Unlock()
	var reply string
	var err error
	switch verb {
	case "caps":
		b, _ := json.Marshal(caps)
		reply = string(b)
	case "run":
		reply, err = a.run(ctx, p.SessionId, cwd, arg)
	case "start":
		reply, err = a.start(ctx, p.SessionId, cwd, arg)
	case "elsewhere":
		reply, err = a.runElsewhere(ctx, "invented-"+p.SessionId, arg)
	case "quit":
		code, _ := strconv.Atoi(arg)
		a.say(ctx, p.SessionId, "bye")
		os.Exit(code)
	case "garbage":
		_, err = io.WriteString(a.stdout, "this is not JSON\n")
		reply = "ok"
	case "crash":
		_, err = a.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: p.SessionId, Command: "/bin/sh", Args: []string{"-c", arg}, Cwd: &cwd})
		if err == nil {
			os.Exit(3)
		}
	case "permission":
		var res acp.RequestPermissionResponse
		res, err = a.conn.RequestPermission(ctx, acp.RequestPermissionRequest{
			SessionId: p.SessionId,
			ToolCall:  acp.ToolCallUpdate{ToolCallId: "perm_1", Title: acp.Ptr("Delete the build directory")},
			Options: []acp.PermissionOption{
				{Kind: acp.PermissionOptionKindAllowOnce, Name: "Allow", OptionId: "allow"},
				{Kind: acp.PermissionOptionKindRejectOnce, Name: "Reject", OptionId: "reject"},
			},
		})
		if err == nil && res.Outcome.Selected != nil {
			reply = "permission: " + string(res.Outcome.Selected.OptionId)
		}
	case "ask":
		reply, err = a.ask(ctx, p.SessionId, cwd, arg)
	case "exec":
		reply, err = a.runItself(ctx, p.SessionId, cwd, arg)
	case "get":
		reply = get(ctx, arg)
	case "dial":
		reply = dial(arg)
	case "lookup":
		reply = lookup(ctx, arg)
	case "download":
		reply = download(arg)
	case "read":
		var res acp.ReadTextFileResponse
		res, err = a.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: p.SessionId, Path: arg})
		reply = "read: " + res.Content
	default:
		reply = "echo: " + text
	}
	if err != nil {
		reply = "error: " + err.Error()
	}
	if err := a.say(ctx, p.SessionId, reply); err != nil {
		return acp.PromptResponse{}, err
	}
	return acp.PromptResponse{StopReason: acp.StopReasonEndTurn}, nil
}

// runElsewhere runs line in session sid, showing it nowhere.
func (a *agent) runElsewhere(ctx context.Context, sid acp.SessionId, line string) (string, error) {
	t, err := a.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid, Command: "/bin/sh", Args: []string{"-c", line}})
	if err != nil {
		return "", err
	}
	st, out, err := a.finish(ctx, sid, t.TerminalId)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("exit=%d output=%s", *st.ExitCode, out.Output), nil
}

// finish waits for a terminal, reads its output and releases it.
func (a *agent) finish(ctx context.Context, sid acp.SessionId, id string) (acp.WaitForTerminalExitResponse, acp.TerminalOutputResponse, error) {
	st, err := a.conn.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: sid, TerminalId: id})
	if err != nil {
		return st, acp.TerminalOutputResponse{}, err
	}
	out, err := a.conn.TerminalOutput(ctx, acp.TerminalOutputRequest{SessionId: sid, TerminalId: id})
	if err != nil {
		return st, out, err
	}
	_, err = a.conn.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: sid, TerminalId: id})
	return st, out, err
}

// ask runs line in a terminal, then asks for permission to go on with the
// terminal shown in the tool call, as an agent asks before its next step.
func (a *agent) ask(ctx context.Context, sid acp.SessionId, cwd, line string) (string, error) {
	t, err := a.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid, Command: "/bin/sh", Args: []string{"-c", line}, Cwd: &cwd})
	if err != nil {
		return "", err
	}
	if _, err := a.conn.WaitForTerminalExit(ctx, acp.WaitForTerminalExitRequest{SessionId: sid, TerminalId: t.TerminalId}); err != nil {
		return "", err
	}
	res, err := a.conn.RequestPermission(ctx, acp.RequestPermissionRequest{
		SessionId: sid,
		ToolCall: acp.ToolCallUpdate{ToolCallId: acp.ToolCallId("ask_" + t.TerminalId), Title: acp.Ptr("Go on?"),
			Content: []acp.ToolCallContent{acp.ToolTerminalRef(t.TerminalId)}},
		Options: []acp.PermissionOption{{Kind: acp.PermissionOptionKindAllowOnce, Name: "Allow", OptionId: "allow"}},
	})
	if err != nil {
		return "", err
	}
	if _, err := a.conn.ReleaseTerminal(ctx, acp.ReleaseTerminalRequest{SessionId: sid, TerminalId: t.TerminalId}); err != nil {
		return "", err
	}
	if res.Outcome.Selected == nil {
		return "cancelled", nil
	}
	return "permission: " + string(res.Outcome.Selected.OptionId), nil
}

// start shows line running in a terminal in a tool call and leaves it
// running.
func (a *agent) start(ctx context.Context, sid acp.SessionId, cwd, line string) (string, error) {
	t, err := a.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid, Command: "/bin/sh", Args: []string{"-c", line}, Cwd: &cwd})
	if err != nil {
		return "", err
	}
	err = a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.StartToolCall(acp.ToolCallId("call_"+t.TerminalId), line,
		acp.WithStartKind(acp.ToolKindExecute), acp.WithStartStatus(acp.ToolCallStatusInProgress),
		acp.WithStartContent([]acp.ToolCallContent{acp.ToolTerminalRef(t.TerminalId)}))})
	return "started " + t.TerminalId, err
}

// run runs line in a terminal shown in a tool call, as agents do.
func (a *agent) run(ctx context.Context, sid acp.SessionId, cwd, line string) (string, error) {
	t, err := a.conn.CreateTerminal(ctx, acp.CreateTerminalRequest{SessionId: sid, Command: "/bin/sh", Args: []string{"-c", line}, Cwd: &cwd})
	if err != nil {
		return "", err
	}
	call := acp.ToolCallId("call_" + t.TerminalId)
	if err := a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.StartToolCall(call, line,
		acp.WithStartKind(acp.ToolKindExecute), acp.WithStartStatus(acp.ToolCallStatusInProgress),
		acp.WithStartContent([]acp.ToolCallContent{acp.ToolTerminalRef(t.TerminalId)}))}); err != nil {
		return "", err
	}
	// Released before the last update: the client keeps showing the
	// output of a terminal embedded in a tool call after release.
	st, out, err := a.finish(ctx, sid, t.TerminalId)
	if err != nil {
		return "", err
	}
	if err := a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.UpdateToolCall(call,
		acp.WithUpdateStatus(acp.ToolCallStatusCompleted),
		acp.WithUpdateContent([]acp.ToolCallContent{acp.ToolTerminalRef(t.TerminalId)}))}); err != nil {
		return "", err
	}
	code := "null"
	if st.ExitCode != nil {
		code = fmt.Sprint(*st.ExitCode)
	}
	return fmt.Sprintf("exit=%s output=%s", code, out.Output), nil
}

func main() {
	var in io.Reader = os.Stdin
	var out io.Writer = os.Stdout
	if prefix := os.Getenv("TESTAGENT_TRANSCRIPT"); prefix != "" {
		fin, err := os.Create(prefix + ".in")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fout, err := os.Create(prefix + ".out")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		// The transcript first: what the editor has seen must be in it
		// even when the agent is stopped right after.
		in, out = io.TeeReader(in, fin), io.MultiWriter(fout, out)
	}
	a := &agent{sessions: make(map[string]string), stdout: out, ready: make(chan struct{})}
	a.conn = acp.NewAgentSideConnection(a, out, in)
	close(a.ready)
	<-a.conn.Done()
}
