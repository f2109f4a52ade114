package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// ahpServer is `sandboxd serve --ahp-listen` with its address and token.
type ahpServer struct {
	srv   *server
	url   string
	token string
}

var ahpAddr = regexp.MustCompile(`AHP terminal channel on ws://([^/]+)/ \(bearer token in ([^)]+)\)`)

func startAHP(t testing.TB, ws string, extra ...string) *ahpServer {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	srv := startServe(t, ws, append([]string{"--ahp-listen", "127.0.0.1:0", "--ahp-token-file", tokenFile}, extra...)...)
	a := ahpListening(t, srv.stderr)
	a.srv = srv
	return a
}

// ahpListening waits for the line a sandboxd started with --ahp-listen
// prints on stderr, and reads the token file it names.
func ahpListening(t testing.TB, stderr *lockedBuffer) *ahpServer {
	t.Helper()
	var m []string
	eventually(t, "AHP address on stderr", 60*time.Second, func() bool {
		m = ahpAddr.FindStringSubmatch(stderr.String())
		return m != nil
	})
	fi, err := os.Stat(m[2])
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode = %o, want 600", fi.Mode().Perm())
	}
	tok, err := os.ReadFile(m[2])
	if err != nil {
		t.Fatal(err)
	}
	return &ahpServer{url: "ws://" + m[1] + "/", token: strings.TrimSpace(string(tok))}
}

// ahpClient is a WebSocket client speaking AHP.
type ahpClient struct {
	t  testing.TB
	ws *websocket.Conn

	mu      sync.Mutex
	nextID  int
	replies map[int]chan rawReply
	actions []envelope // in arrival order, parsed once by read
	changed chan struct{}
	// shown is a channel's content in the snapshot its subscription got.
	shown map[string]string
}

func dialAHP(t testing.TB, a *ahpServer, header http.Header) (*ahpClient, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if header == nil {
		header = http.Header{"Authorization": {"Bearer " + a.token}}
	}
	ws, _, err := websocket.Dial(ctx, a.url, &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(64 << 20)
	c := &ahpClient{t: t, ws: ws, replies: map[int]chan rawReply{}, changed: make(chan struct{}), shown: map[string]string{}}
	go c.read()
	t.Cleanup(func() { ws.Close(websocket.StatusNormalClosure, "") })
	return c, nil
}

func (c *ahpClient) read() {
	for {
		_, data, err := c.ws.Read(context.Background())
		if err != nil {
			return
		}
		var m struct {
			ID     *int            `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		json.Unmarshal(data, &m)
		c.mu.Lock()
		if m.ID != nil {
			var r rawReply
			json.Unmarshal(data, &r)
			if ch, ok := c.replies[*m.ID]; ok {
				ch <- r
			}
		} else if m.Method == "action" {
			var e envelope
			json.Unmarshal(m.Params, &e)
			c.actions = append(c.actions, e)
			close(c.changed)
			c.changed = make(chan struct{})
		}
		c.mu.Unlock()
	}
}

func (c *ahpClient) call(method string, params any) rawReply {
	c.t.Helper()
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	ch := make(chan rawReply, 1)
	c.replies[id] = ch
	c.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if err := c.ws.Write(context.Background(), websocket.MessageText, b); err != nil {
		c.t.Fatalf("%s: %v", method, err)
	}
	select {
	case r := <-ch:
		return r
	case <-time.After(60 * time.Second):
		c.t.Fatalf("%s: no reply", method)
	}
	return rawReply{}
}

func (c *ahpClient) notify(method string, params any) {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
	if err := c.ws.Write(context.Background(), websocket.MessageText, b); err != nil {
		c.t.Fatalf("%s: %v", method, err)
	}
}

type envelope struct {
	Channel   string `json:"channel"`
	ServerSeq int64  `json:"serverSeq"`
	Action    struct {
		Type        string `json:"type"`
		Data        string `json:"data"`
		Cwd         string `json:"cwd"`
		CommandLine string `json:"commandLine"`
		CommandID   string `json:"commandId"`
		ExitCode    *int   `json:"exitCode"`
		DurationMs  *int64 `json:"durationMs"`
		Claim       any    `json:"claim"`
		Title       string `json:"title"`
		Cols, Rows  int
	} `json:"action"`
	RejectionReason string `json:"rejectionReason"`
}

func (c *ahpClient) envelopes() []envelope {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.actions[:len(c.actions):len(c.actions)]
}

// subscribe subscribes to a channel and keeps the content its snapshot
// shows, so that data() misses nothing emitted before the subscription.
func (c *ahpClient) subscribe(channel string) {
	c.t.Helper()
	r := c.call("subscribe", map[string]any{"channel": channel})
	if r.Error != nil {
		c.t.Fatalf("subscribe %s: %+v", channel, r.Error)
	}
	var res struct {
		Snapshot struct {
			State TerminalStateJSON `json:"state"`
		} `json:"snapshot"`
	}
	json.Unmarshal(r.Result, &res)
	c.mu.Lock()
	c.shown[channel] = res.Snapshot.State.text()
	c.mu.Unlock()
}

// data returns the content of a channel at subscription and all
// terminal/data since, joined.
func (c *ahpClient) data(channel string) string {
	var b strings.Builder
	c.mu.Lock()
	b.WriteString(c.shown[channel])
	c.mu.Unlock()
	for _, e := range c.envelopes() {
		if e.Channel == channel && e.Action.Type == "terminal/data" {
			b.WriteString(e.Action.Data)
		}
	}
	return b.String()
}

func (c *ahpClient) initialize(id string) {
	c.t.Helper()
	r := c.call("initialize", map[string]any{"channel": "ahp-root://", "protocolVersions": []string{"0.4.0"}, "clientId": id, "initialSubscriptions": []string{"ahp-root://"}})
	if r.Error != nil {
		c.t.Fatalf("initialize: %+v", r.Error)
	}
}

// terminalClient connects as clientID and creates a terminal it holds the
// claim of, in directory dir.
func terminalClient(t testing.TB, a *ahpServer, clientID, channel, dir string) *ahpClient {
	t.Helper()
	c, err := dialAHP(t, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.initialize(clientID)
	if r := c.call("createTerminal", map[string]any{"channel": channel, "claim": map[string]any{"kind": "client", "clientId": clientID}, "cwd": "file://" + dir}); r.Error != nil {
		t.Fatalf("createTerminal: %+v", r.Error)
	}
	return c
}

// subscribedTerminal is terminalClient subscribed to its terminal.
func subscribedTerminal(t testing.TB, a *ahpServer, clientID, channel, dir string) *ahpClient {
	t.Helper()
	c := terminalClient(t, a, clientID, channel, dir)
	c.subscribe(channel)
	return c
}

// executed reports whether the client saw command line start on channel.
func (c *ahpClient) executed(channel, line string) bool {
	for _, e := range c.envelopes() {
		if e.Channel == channel && e.Action.Type == "terminal/commandExecuted" && e.Action.CommandLine == line {
			return true
		}
	}
	return false
}

// watcher connects as clientID and subscribes to channel.
func watcher(t testing.TB, a *ahpServer, clientID, channel string) *ahpClient {
	t.Helper()
	c, err := dialAHP(t, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.initialize(clientID)
	c.subscribe(channel)
	return c
}

func (c *ahpClient) input(channel, text string, seq int) {
	c.notify("dispatchAction", map[string]any{"channel": channel, "clientSeq": seq, "action": map[string]any{"type": "terminal/input", "data": text}})
}

// TestServeSharesTheStdioPeersContainerOverAHP: on `serve` over stdio, as
// on `wrap`, an AHP terminal in the peer's workspace runs in the container
// the peer's commands run in.
func TestServeSharesTheStdioPeersContainerOverAHP(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, _ := sh(t, ctx, a.srv.agent(), "agent-session", "grep /etc/hostname /proc/self/mountinfo")
	m := containerInMountinfo.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no container id in the command's mountinfo: %q", out)
	}
	const term = "ahp-terminal:/shared"
	c := subscribedTerminal(t, a, "person", term, ws)
	c.input(term, "grep /etc/hostname /proc/self/mountinfo; echo do''ne\r", 1)
	eventually(t, "done", time.Minute, func() bool { return strings.Contains(c.data(term), "done\r\n") })
	if got := containerInMountinfo.FindStringSubmatch(c.data(term)); got == nil || got[1] != m[1] {
		t.Errorf("the terminal runs in another container than the peer's %.12s: %q", m[1], c.data(term))
	}
	if ids := containersOf(t, a.srv.cmd.Process.Pid); len(ids) != 1 {
		t.Errorf("containers %v, want the one session's", ids)
	}
}

func TestAHPTerminal(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	c, err := dialAHP(t, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.initialize("client-1")
	const term = "ahp-terminal:/t1"
	// A cwd outside the served workspace is the client's mistake.
	if r := c.call("createTerminal", map[string]any{"channel": "ahp-terminal:/etc", "claim": map[string]any{"kind": "client", "clientId": "client-1"}, "cwd": "file:///etc"}); r.Error == nil || r.Error.Code != -32602 {
		t.Errorf("createTerminal in /etc: %+v, want -32602", r.Error)
	}
	r := c.call("createTerminal", map[string]any{"channel": term, "claim": map[string]any{"kind": "client", "clientId": "client-1"}, "name": "main", "cwd": "file://" + ws, "cols": 100, "rows": 30})
	if r.Error != nil {
		t.Fatalf("createTerminal: %+v", r.Error)
	}
	c.subscribe(term)
	// A second client sees the same actions in the same order.
	c2 := watcher(t, a, "client-2", term)

	eventually(t, "prompt", 60*time.Second, func() bool { return strings.Contains(c.data(term), "$ ") })
	c.input(term, "cd /tmp && echo hi; (exit 3)\r", 1)
	var finished envelope
	// The next prompt comes after the shell integration's D and P.
	eventually(t, "command finished and the next prompt", 60*time.Second, func() bool {
		for _, e := range c.envelopes() {
			if e.Action.Type == "terminal/commandFinished" {
				finished = e
				_, after, ok := strings.Cut(c.data(term), "hi\r\n")
				return ok && strings.Contains(after, "$ ")
			}
		}
		return false
	})
	if finished.Action.ExitCode == nil || *finished.Action.ExitCode != 3 || finished.Action.DurationMs == nil {
		t.Errorf("commandFinished = %+v, want exit code 3 and a duration", finished.Action)
	}
	var executed, cwd bool
	for _, e := range c.envelopes() {
		switch e.Action.Type {
		case "terminal/commandExecuted":
			executed = e.Action.CommandLine == "cd /tmp && echo hi; (exit 3)" && e.Action.CommandID == finished.Action.CommandID
		case "terminal/cwdChanged":
			cwd = cwd || e.Action.Cwd == "file:///tmp"
		}
	}
	if !executed || !cwd {
		t.Errorf("commandExecuted with the line: %v; cwdChanged to /tmp: %v", executed, cwd)
	}
	if d := c.data(term); !strings.Contains(d, "hi\r\n") || strings.Contains(d, "\x1b]633") {
		t.Errorf("data = %q: want hi and no OSC 633", d)
	}

	// Resize, then the PTY reports the new size.
	c.notify("dispatchAction", map[string]any{"channel": term, "clientSeq": 2, "action": map[string]any{"type": "terminal/resized", "cols": 120, "rows": 40}})
	c.input(term, "stty size\r", 3)
	eventually(t, "stty size shows 40 120", 60*time.Second, func() bool { return strings.Contains(c.data(term), "40 120\r\n") })

	// A client without the claim cannot change it.
	c2.notify("dispatchAction", map[string]any{"channel": term, "clientSeq": 1, "action": map[string]any{"type": "terminal/claimed", "claim": map[string]any{"kind": "client", "clientId": "client-2"}}})
	eventually(t, "rejected claim", 30*time.Second, func() bool {
		for _, e := range c2.envelopes() {
			if e.Action.Type == "terminal/claimed" && e.RejectionReason != "" {
				return true
			}
		}
		return false
	})
	// The holder sees it too, rejected: nothing changed hands.
	for _, e := range c.envelopes() {
		if e.Action.Type == "terminal/claimed" && e.RejectionReason == "" {
			t.Errorf("the other client saw a claim change: %+v", e)
		}
	}

	// Both clients saw the same terminal actions in the same order.
	c.input(term, "echo do''ne\r", 4)
	eventually(t, "second client sees done", 60*time.Second, func() bool {
		return strings.Contains(c2.data(term), "done\r\n") && strings.Contains(c.data(term), "done\r\n")
	})
	seqs := func(c *ahpClient) []string {
		var s []string
		for _, e := range c.envelopes() {
			if e.Channel == term && e.RejectionReason == "" && e.ServerSeq > 0 {
				s = append(s, fmt.Sprintf("%d:%s", e.ServerSeq, e.Action.Type))
			}
		}
		return s
	}
	s1, s2 := seqs(c), seqs(c2)
	// c2 subscribed a little later; from its first action on, the two agree.
	if len(s2) == 0 || !strings.Contains(strings.Join(s1, " "), strings.Join(s2[:len(s2)/2], " ")) {
		t.Errorf("clients disagree:\n%v\n%v", s1, s2)
	}
	var last int64
	for _, e := range c.envelopes() {
		if e.RejectionReason == "" && e.ServerSeq <= last {
			t.Fatalf("serverSeq not increasing: %d after %d", e.ServerSeq, last)
		}
		if e.RejectionReason == "" {
			last = e.ServerSeq
		}
	}

	// Two clients resizing at once: the size all are told last is the
	// PTY's.
	resized := func() (n int, last string) {
		for _, e := range c.envelopes() {
			if e.Action.Type == "terminal/resized" && e.RejectionReason == "" {
				n++
				last = fmt.Sprintf("%d %d\r\n", e.Action.Rows, e.Action.Cols)
			}
		}
		return n, last
	}
	before, _ := resized()
	var wg sync.WaitGroup
	for i, cl := range []*ahpClient{c, c2} {
		wg.Go(func() {
			for k := range 10 {
				cl.notify("dispatchAction", map[string]any{"channel": term, "clientSeq": 10 + k, "action": map[string]any{"type": "terminal/resized", "cols": 50 + 20*i + k, "rows": 20 + k}})
			}
		})
	}
	wg.Wait()
	eventually(t, "every resize told", 60*time.Second, func() bool { n, _ := resized(); return n == before+20 })
	_, size := resized()
	c.input(term, "stty size\r", 30)
	eventually(t, "stty size shows "+size, 60*time.Second, func() bool {
		return strings.HasSuffix(c.data(term), size) || strings.Contains(c.data(term), "stty size\r\n"+size)
	})

	// Dispose hangs the terminal up, and leaves no process of it in the
	// container.
	const line = "trap 'echo hung up >/tmp/hup' HUP; sleep 312"
	c.input(term, line+"\r", 5)
	eventually(t, "sleep started", 30*time.Second, func() bool { return c.executed(term, line) })
	if r := c.call("disposeTerminal", map[string]any{"channel": term}); r.Error != nil {
		t.Fatalf("dispose: %+v", r.Error)
	}
	ids := containersOf(t, a.srv.cmd.Process.Pid)
	if len(ids) != 1 {
		t.Fatalf("containers = %v", ids)
	}
	if out := containerOutput(t, ids[0], "ps", "-o", "args"); strings.Contains(out, "sleep 312") || strings.Contains(out, "bash") {
		t.Errorf("processes left after dispose:\n%s", out)
	}
	if out := containerOutput(t, ids[0], "cat", "/tmp/hup"); out != "hung up\n" {
		t.Errorf("the shell was not hung up: %q", out)
	}
}

// reconnectResult is a reconnect answer, either form.
type reconnectResult struct {
	Type      string            `json:"type"`
	Actions   []json.RawMessage `json:"actions"`
	Missing   []string          `json:"missing"`
	Snapshots []struct {
		Resource string            `json:"resource"`
		State    TerminalStateJSON `json:"state"`
	} `json:"snapshots"`
}

// TestAHPReconnect drops a client, lets the terminal go on, and reconnects:
// first within the replay buffer (the missed actions come back), then after
// more output than the buffer holds (snapshots come back).
func TestAHPReconnect(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	const term = "ahp-terminal:/r"
	c1 := subscribedTerminal(t, a, "dropped", term, ws)
	typist := watcher(t, a, "typist", term)
	typist.input(term, "echo o''ne\r", 1)
	eventually(t, "one", 60*time.Second, func() bool { return strings.Contains(c1.data(term), "one\r\n") })
	lastSeen := func(c *ahpClient) int64 {
		var last int64
		for _, e := range c.envelopes() {
			last = max(last, e.ServerSeq)
		}
		return last
	}
	seen := lastSeen(c1)
	c1.ws.Close(websocket.StatusGoingAway, "network gone")

	typist.input(term, "echo t''wo\r", 2)
	eventually(t, "two", 60*time.Second, func() bool { return strings.Contains(typist.data(term), "two\r\n") })

	reconnect := func(since int64) (*ahpClient, reconnectResult) {
		c, err := dialAHP(t, a, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := c.call("reconnect", map[string]any{"channel": "ahp-root://", "clientId": "dropped", "lastSeenServerSeq": since, "subscriptions": []string{term, "ahp-terminal:/never-was"}})
		if r.Error != nil {
			t.Fatalf("reconnect: %+v", r.Error)
		}
		var res reconnectResult
		if err := json.Unmarshal(r.Result, &res); err != nil {
			t.Fatal(err)
		}
		return c, res
	}

	c2, res := reconnect(seen)
	if res.Type != "replay" || len(res.Missing) != 1 || res.Missing[0] != "ahp-terminal:/never-was" {
		t.Fatalf("reconnect: type %q, missing %v; want replay with the unknown terminal missing", res.Type, res.Missing)
	}
	var replayed strings.Builder
	prev := seen
	for _, raw := range res.Actions {
		var e envelope
		json.Unmarshal(raw, &e)
		if e.ServerSeq <= prev {
			t.Errorf("replayed serverSeq %d after %d", e.ServerSeq, prev)
		}
		prev = e.ServerSeq
		if e.Action.Type == "terminal/data" {
			replayed.WriteString(e.Action.Data)
		}
	}
	if !strings.Contains(replayed.String(), "two\r\n") || strings.Contains(replayed.String(), "one\r\n") {
		t.Errorf("replayed data %q: want what was missed (two) and nothing before (one)", replayed.String())
	}
	// The reconnected client is subscribed again.
	typist.input(term, "echo th''ree\r", 3)
	eventually(t, "three after reconnect", 60*time.Second, func() bool { return strings.Contains(c2.data(term), "three\r\n") })

	// More output than the replay buffer holds: snapshots instead.
	seen = lastSeen(c2)
	c2.ws.Close(websocket.StatusGoingAway, "network gone")
	typist.input(term, "head -c 12000000 /dev/zero | tr '\\0' y; echo; echo fo''ur\r", 4)
	eventually(t, "four", 2*time.Minute, func() bool {
		d := typist.data(term)
		return strings.Contains(d[max(0, len(d)-200):], "four\r\n")
	})
	_, res = reconnect(seen)
	if res.Type != "snapshot" || len(res.Snapshots) != 1 || res.Snapshots[0].Resource != term {
		t.Fatalf("reconnect after 12 MB: type %q, %d snapshots; want one snapshot of %s", res.Type, len(res.Snapshots), term)
	}
	if text := res.Snapshots[0].State.text(); !strings.Contains(text, "four\r\n") || len(text) > 1<<20 {
		t.Errorf("snapshot holds %d bytes ending %q; want the tail, at most the 1 MiB cap", len(text), text[max(0, len(text)-100):])
	}
}

// TestAHPTitleAndForgedSequences checks that OSC 0/2 set the terminal's
// title, and that a program in the terminal finds no nonce to forge command
// lines with, nor gets a forged one through.
// TestAHPShellIgnoresHomeInputrc: a command that writes a readline macro
// into $HOME/.inputrc (HOME is /tmp, which any command may write) cannot
// have the next terminal's shell give away its nonce: the shell reads no
// ~/.inputrc.
func TestAHPShellIgnoresHomeInputrc(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	const one, two = "ahp-terminal:/one", "ahp-terminal:/two"
	c := subscribedTerminal(t, a, "client-one", one, ws)
	c.input(one, `printf '%s\n' '"\C-m": " #\C-a echo N=$__sbx_nonce >/tmp/.n;\C-j"' > "$HOME/.inputrc"; echo wro''te`+"\r", 1)
	eventually(t, "the macro written", 60*time.Second, func() bool { return strings.Contains(c.data(one), "wrote\r\n") })
	d := subscribedTerminal(t, a, "client-two", two, ws)
	// Typed once readline reads the keys: typed earlier, the line waits
	// in the terminal, whose own line discipline turns Enter into ^J.
	eventually(t, "the next terminal's prompt", 60*time.Second, func() bool { return strings.Contains(d.data(two), "$ ") })
	d.input(two, "echo typ''ed\r", 1)
	eventually(t, "a line typed in the next terminal run as typed", 60*time.Second, func() bool { return strings.Contains(d.data(two), "typed\r\n") })
	c.input(one, "cat /tmp/.n 2>/dev/null; echo ca''t=$?\r", 2)
	eventually(t, "cat done", 60*time.Second, func() bool { return regexp.MustCompile(`cat=\d`).MatchString(c.data(one)) })
	if !strings.Contains(c.data(one), "cat=1") {
		t.Errorf("the next terminal's shell ran the planted macro and gave away its nonce: %q", c.data(one))
	}
}

// TestAHPShellExitFinishesItsCommand: a shell that ends during a command
// (`exit 3` is one) finishes it, its code unknown, before the terminal
// exits: clients would show it running for ever.
func TestAHPShellExitFinishesItsCommand(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	const term = "ahp-terminal:/exit"
	c := subscribedTerminal(t, a, "client-x", term, ws)
	c.input(term, "exit 3\r", 1)
	eventually(t, "the terminal exited", 60*time.Second, func() bool {
		for _, e := range c.envelopes() {
			if e.Channel == term && e.Action.Type == "terminal/exited" {
				return true
			}
		}
		return false
	})
	var executed, finished string
	for _, e := range c.envelopes() {
		switch {
		case e.Channel != term:
		case e.Action.Type == "terminal/commandExecuted" && e.Action.CommandLine == "exit 3":
			executed = e.Action.CommandID
		case e.Action.Type == "terminal/commandFinished":
			finished = e.Action.CommandID
			if e.Action.ExitCode != nil {
				t.Errorf("commandFinished of a command the shell ended in: exit code %d, want none", *e.Action.ExitCode)
			}
		case e.Action.Type == "terminal/exited" && finished != executed:
			t.Errorf("terminal/exited before commandFinished of %q (finished: %q)", executed, finished)
		}
	}
	if executed == "" || finished != executed {
		t.Errorf("commandExecuted %q, commandFinished %q: want the exit finished", executed, finished)
	}
}

func TestAHPTitleAndForgedSequences(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	const term = "ahp-terminal:/title"
	c := subscribedTerminal(t, a, "client-t", term, ws)
	c.input(term, "printf '\\033]0;build: step 1\\007'; printf '\\033]2;build: step 2\\033\\\\'; echo ti''tled\r", 1)
	eventually(t, "titled", 60*time.Second, func() bool { return strings.Contains(c.data(term), "titled\r\n") })
	var titles []string
	for _, e := range c.envelopes() {
		if e.Action.Type == "terminal/titleChanged" {
			titles = append(titles, e.Action.Title)
		}
	}
	if strings.Join(titles, "|") != "build: step 1|build: step 2" {
		t.Errorf("titles = %q, want both, in order", titles)
	}
	// The list of terminals follows within a fraction of a second (it
	// goes out at most every 200 ms, for programs that set titles in a
	// loop).
	eventually(t, "the root's list with the title", 30*time.Second, func() bool {
		r := c.call("subscribe", map[string]any{"channel": "ahp-root://"})
		return strings.Contains(string(r.Result), `"title":"build: step 2"`)
	})
	// Unlike OSC 633, they stay in the data for the client's emulator.
	if d := c.data(term); !strings.Contains(d, "\x1b]0;build: step 1\a") {
		t.Errorf("title sequence missing from the data: %q", d)
	}

	// No process in the container has the nonce in its environment, and a
	// command line forged with a wrong nonce is not taken.
	// (The container's own processes, another user's, are not readable:
	// their errors are left out.)
	c.input(term, "grep -l SANDBOXD_NONCE /proc/[0-9]*/environ 2>/dev/null; echo gr''ep=$?\r", 2)
	eventually(t, "grep done", 60*time.Second, func() bool { return strings.Contains(c.data(term), "grep=") })
	eventually(t, "grep exit code", 10*time.Second, func() bool { return regexp.MustCompile(`grep=\d`).MatchString(c.data(term)) })
	if d := c.data(term); strings.Contains(d, "grep=0") || strings.Contains(d, "/environ\r\n") {
		t.Errorf("the nonce is visible in a process environment: %q", d[max(0, strings.LastIndex(d, "grep -l")):])
	}
	// A forged E and C: with the nonce wrong, neither is taken; only the
	// command typed is reported.
	forge := "printf '\\033]633;E;rm -rf /;0123456789abcdef0123456789abcdef\\007\\033]633;C\\007'; echo for''ged"
	c.input(term, forge+"\r", 3)
	eventually(t, "forged", 60*time.Second, func() bool { return strings.Contains(c.data(term), "forged\r\n") })
	var lines []string
	for _, e := range c.envelopes() {
		if e.Action.Type == "terminal/commandExecuted" {
			lines = append(lines, e.Action.CommandLine)
		}
	}
	if len(lines) != 3 || lines[2] != forge {
		t.Errorf("command lines %q: want the three typed, the forged one not", lines)
	}
	// A command line with an ESC or a BEL in it (typed with Ctrl-V) is
	// escaped whole: no part of its sequence, the nonce least of all,
	// spills into the data. Typed at the prompt: while a command runs, the
	// line discipline would take the Ctrl-V itself, and readline would
	// then read the ESC as the start of a key sequence.
	eventually(t, "prompt", 60*time.Second, func() bool {
		d := c.data(term)
		return strings.Contains(d[strings.LastIndex(d, "forged\r\n"):], "$ ")
	})
	c.input(term, "echo \x16\x1b[0mx\x16\x07; echo esc''aped\r", 4)
	eventually(t, "escaped", 60*time.Second, func() bool { return strings.Contains(c.data(term), "escaped\r\n") })
	if !c.executed(term, "echo \x1b[0mx\x07; echo esc''aped") {
		t.Errorf("the command line with ESC and BEL is not reported whole")
	}
	d := c.data(term)
	if m := regexp.MustCompile(`[0-9a-f]{32}`).FindString(d[strings.LastIndex(d, "forged\r\n"):]); m != "" {
		t.Errorf("the nonce %s is in the data", m)
	}
}

func TestAHPRefusesWrongTokenAndForeignOrigin(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	c, err := dialAHP(t, a, http.Header{"Authorization": {"Bearer wrong"}})
	if err != nil {
		t.Fatal(err)
	}
	r := c.call("initialize", map[string]any{"channel": "ahp-root://", "protocolVersions": []string{"0.4.0"}, "clientId": "x"})
	if r.Error == nil || r.Error.Code != -32007 {
		t.Errorf("wrong token: %+v, want AuthRequired -32007", r.Error)
	}
	_, err = dialAHP(t, a, http.Header{"Authorization": {"Bearer " + a.token}, "Origin": {"https://evil.example"}})
	if err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("foreign origin: err = %v, want a refused handshake (403)", err)
	}
}

// A terminal whose program does not read its input fills every buffer on
// the way to it; the client that typed must still be served, get a clear
// rejection once too much waits, and be able to dispose the terminal.
func TestAHPInputToATerminalThatDoesNotRead(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	const term = "ahp-terminal:/stuck"
	c := subscribedTerminal(t, a, "client-s", term, ws)
	c.input(term, "sleep 600\r", 1)
	eventually(t, "sleep started", 60*time.Second, func() bool { return c.executed(term, "sleep 600") })
	// Whole lines, so that the line discipline keeps them for a reader
	// rather than dropping what does not fit.
	line := strings.Repeat("x", 1023) + "\r"
	chunk := strings.Repeat(line, 64) // 64 KiB
	const chunks = 96                 // 6 MiB: far beyond every buffer
	for i := range chunks {
		c.input(term, chunk, 10+i)
	}
	eventually(t, "input rejected", 60*time.Second, func() bool {
		for _, e := range c.envelopes() {
			if e.Action.Type == "terminal/input" && strings.Contains(e.RejectionReason, "is not reading its input") {
				return true
			}
		}
		return false
	})
	// The connection still answers, and the terminal goes.
	if r := c.call("createTerminal", map[string]any{"channel": "ahp-terminal:/other", "claim": map[string]any{"kind": "client", "clientId": "client-s"}}); r.Error != nil {
		t.Fatalf("createTerminal after stuck input: %+v", r.Error)
	}
	if r := c.call("disposeTerminal", map[string]any{"channel": term}); r.Error != nil {
		t.Fatalf("dispose: %+v", r.Error)
	}
	ids := containersOf(t, a.srv.cmd.Process.Pid)
	if len(ids) != 1 {
		t.Fatalf("containers = %v", ids)
	}
	if out := containerOutput(t, ids[0], "ps", "-o", "args"); strings.Contains(out, "sleep 600") || !strings.Contains(out, "ps -o args") {
		t.Errorf("processes left after dispose:\n%s", out)
	}
}

// TestAHPNonceIsTypedNotInherited: the shell gets its nonce through the
// terminal, typed by sandboxd with echo off before any client's input, not
// through an environment or arguments another process could read in
// /proc. Input typed before the shell is ready runs after it, detected as
// any command, and the nonce never shows in the data.
func TestAHPNonceIsTypedNotInherited(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	const term = "ahp-terminal:/typeahead"
	c := subscribedTerminal(t, a, "client-n", term, ws)
	c.input(term, "echo ea''rly\r", 1)
	eventually(t, "early", 60*time.Second, func() bool { return strings.Contains(c.data(term), "early\r\n") })
	eventually(t, "early detected", 10*time.Second, func() bool { return c.executed(term, "echo ea''rly") })
	c.input(term, "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline | tr '\\0' '\\n' | grep -cE '[0-9a-f]{32}'; echo sc''anned\r", 2)
	eventually(t, "scanned", 60*time.Second, func() bool { return strings.Contains(c.data(term), "scanned\r\n") })
	d := c.data(term)
	if !strings.Contains(d, "\r\n0\r\nscanned\r\n") {
		t.Errorf("a process in the terminal holds a nonce-like value in its environment or arguments: %q", d[strings.LastIndex(d, "cat /proc"):])
	}
	if m := regexp.MustCompile(`[0-9a-f]{32}`).FindString(d); m != "" {
		t.Errorf("the data shows %q, a nonce", m)
	}
}

// TestAHPDisposeHoldsUpNothingElse: a disposal that waits out the kill's
// grace period (the shell ignores SIGHUP) does not hold up the client's
// input to its other terminal meanwhile, and is answered once it is done.
func TestAHPDisposeHoldsUpNothingElse(t *testing.T) {
	ws := workspace(t)
	cfg := filepath.Join(t.TempDir(), "sandbox.toml")
	writeFile(t, cfg, "[terminal]\nkill_grace = \"20s\"\n")
	a := startAHP(t, ws, "--config", cfg)
	c := subscribedTerminal(t, a, "me", "ahp-terminal:/a", ws)
	if r := c.call("createTerminal", map[string]any{"channel": "ahp-terminal:/b", "claim": map[string]any{"kind": "client", "clientId": "me"}, "cwd": "file://" + ws}); r.Error != nil {
		t.Fatalf("createTerminal: %+v", r.Error)
	}
	c.subscribe("ahp-terminal:/b")
	const stubborn = "trap '' HUP; exec sleep 1000"
	c.input("ahp-terminal:/b", stubborn+"\r", 1)
	eventually(t, "the stubborn command runs", time.Minute, func() bool { return c.executed("ahp-terminal:/b", stubborn) })
	listed := func() int {
		n := 0
		for _, e := range c.envelopes() {
			if e.Action.Type == "root/terminalsChanged" {
				n++
			}
		}
		return n
	}
	before := listed()
	var disposed atomic.Bool
	done := make(chan rawReply, 1)
	go func() {
		r := c.call("disposeTerminal", map[string]any{"channel": "ahp-terminal:/b"})
		disposed.Store(true)
		done <- r
	}()
	// Taken off the list: the server has read the disposal.
	eventually(t, "ahp-terminal:/b taken off the list", 15*time.Second, func() bool { return listed() > before })
	c.input("ahp-terminal:/a", "echo $((6*7))\r", 2)
	eventually(t, "the other terminal's echo", 15*time.Second, func() bool { return strings.Contains(c.data("ahp-terminal:/a"), "42") })
	if disposed.Load() {
		t.Error("the disposal was answered before its grace period ended")
	}
	if r := <-done; r.Error != nil {
		t.Errorf("disposeTerminal: %+v", r.Error)
	}
}

// TestAHPKilledShellHasAnExitCode: a terminal whose process dies of a
// signal sandboxd can name (here the OOM killer's) exits with the shell's
// 128+n, since an exitCode is what tells clients that a terminal exited;
// one that exits by itself keeps its own code.
func TestAHPKilledShellHasAnExitCode(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	for _, tc := range []struct {
		term, line string
		want       int
	}{
		{"ahp-terminal:/killed", "exec tail /dev/zero\r", 137},
		{"ahp-terminal:/exits", "exit 7\r", 7},
	} {
		c := subscribedTerminal(t, a, "client-"+strings.TrimPrefix(tc.term, "ahp-terminal:/"), tc.term, ws)
		c.input(tc.term, tc.line, 1)
		var got *int
		eventually(t, "terminal/exited on "+tc.term, 60*time.Second, func() bool {
			for _, e := range c.envelopes() {
				if e.Channel == tc.term && e.Action.Type == "terminal/exited" {
					got = e.Action.ExitCode
					return true
				}
			}
			return false
		})
		if got == nil || *got != tc.want {
			t.Errorf("%s: exitCode = %v, want %d", tc.term, got, tc.want)
		}
	}
}

// TestAHPConnectionsAndTerminalsLeaveNoDescriptors: clients that come,
// make a terminal, dispose of it or leave it running, and go, and
// refused connections, leave sandboxd with the descriptors it had.
func TestAHPConnectionsAndTerminalsLeaveNoDescriptors(t *testing.T) {
	ws := workspace(t)
	a := startAHP(t, ws)
	pid := a.srv.cmd.Process.Pid
	// Warm up: the session, the engine connection pool.
	warm := subscribedTerminal(t, a, "warm", "ahp-terminal:/warm", ws)
	warm.input("ahp-terminal:/warm", "echo wa''rm\r", 1)
	eventually(t, "warm", 60*time.Second, func() bool { return strings.Contains(warm.data("ahp-terminal:/warm"), "warm\r\n") })
	before := fdCount(t, pid)
	const n = 20 // half left running: well more than the slack below
	for i := range n {
		term := fmt.Sprintf("ahp-terminal:/leak%d", i)
		c := subscribedTerminal(t, a, fmt.Sprintf("leak%d", i), term, ws)
		c.input(term, "echo st''arted\r", 1)
		eventually(t, "started", 60*time.Second, func() bool { return strings.Contains(c.data(term), "started\r\n") })
		if i%2 == 0 {
			if r := c.call("disposeTerminal", map[string]any{"channel": term}); r.Error != nil {
				t.Fatalf("dispose: %+v", r.Error)
			}
		}
		c.ws.Close(websocket.StatusNormalClosure, "")
		// Refused: a wrong token.
		if bad, err := dialAHP(t, a, http.Header{"Authorization": {"Bearer wrong"}}); err == nil {
			bad.ws.CloseNow()
		}
	}
	// The terminals left running hold their exec connections; dispose
	// of them from another client, then all is as it was.
	c := watcher(t, a, "sweeper", "ahp-root://")
	for i := 1; i < n; i += 2 {
		if r := c.call("disposeTerminal", map[string]any{"channel": fmt.Sprintf("ahp-terminal:/leak%d", i)}); r.Error != nil {
			t.Fatalf("dispose: %+v", r.Error)
		}
	}
	c.ws.Close(websocket.StatusNormalClosure, "")
	eventually(t, "descriptors back to the baseline", 30*time.Second, func() bool {
		return fdCount(t, pid) <= before+4
	})
}
