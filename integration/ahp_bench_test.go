package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/moby/moby/client"
)

// testExecRelay builds integration/testexecrelay once per test binary.
var testExecRelay = sync.OnceValues(func() (string, error) { return buildHelper("testexecrelay") })

// BenchmarkAHPKeystroke compares the keystroke round trip through the AHP
// channel (terminal/input sent to the echoed terminal/data received) with a
// bare Engine API TTY exec of bash in the same container, and with a relay
// process that only copies the bytes of its own exec (testexecrelay, the
// floor for any process in the path), interleaved. All read in the
// goroutine that measures, so none pays for a hand-off inside the test.
func BenchmarkAHPKeystroke(b *testing.B) {
	ws := workspace(b)
	a := startAHP(b, ws)
	ctx := context.Background()
	conn, _, err := websocket.Dial(ctx, a.url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + a.token}}})
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(websocket.StatusNormalClosure, "")
	conn.SetReadLimit(64 << 20)
	const term = "ahp-terminal:/bench"
	var shown strings.Builder // the terminal's data so far
	// next reads one message; it returns the data of a terminal/data action.
	next := func() (id int, data string) {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			b.Fatal(err)
		}
		var m struct {
			ID     int `json:"id"`
			Params struct {
				Action struct {
					Type string `json:"type"`
					Data string `json:"data"`
				} `json:"action"`
			} `json:"params"`
			Error any `json:"error"`
		}
		json.Unmarshal(msg, &m)
		if m.Error != nil {
			b.Fatalf("error: %s", msg)
		}
		if m.Params.Action.Type == "terminal/data" {
			shown.WriteString(m.Params.Action.Data)
			return m.ID, m.Params.Action.Data
		}
		return m.ID, ""
	}
	id := 0
	call := func(method string, params any) {
		id++
		msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
		if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
			b.Fatal(err)
		}
		for {
			if got, _ := next(); got == id {
				return
			}
		}
	}
	seq := 0
	// press types keys and reads until the echo of the last one arrives.
	press := func(keys string) {
		seq++
		msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "dispatchAction", "params": map[string]any{"channel": term, "clientSeq": seq, "action": map[string]any{"type": "terminal/input", "data": keys}}})
		if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
			b.Fatal(err)
		}
		last := keys[len(keys)-1]
		for {
			if _, d := next(); strings.IndexByte(d, last) >= 0 {
				return
			}
		}
	}
	call("initialize", map[string]any{"protocolVersions": []string{"0.4.0"}, "clientId": "bench"})
	// 1000 columns: the command lines stay shorter than that, so readline
	// echoes each key rather than redrawing a scrolled line.
	call("createTerminal", map[string]any{"channel": term, "claim": map[string]any{"kind": "client", "clientId": "bench"}, "cwd": "file://" + ws, "cols": 1000, "rows": 24})
	call("subscribe", map[string]any{"channel": term})

	ids := containersOf(b, a.srv.cmd.Process.Pid)
	if len(ids) != 1 {
		b.Fatalf("containers = %v", ids)
	}
	cli := testEnv.cli
	ex, err := cli.ExecCreate(ctx, ids[0], client.ExecCreateOptions{User: "1000:1000", TTY: true, AttachStdin: true, AttachStdout: true, AttachStderr: true, Cmd: []string{"bash", "--norc", "-i"}})
	if err != nil {
		b.Fatal(err)
	}
	att, err := cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{TTY: true})
	if err != nil {
		b.Fatal(err)
	}
	defer att.Close()
	// API 1.41 ignores ConsoleSize: size the PTY as sandboxd does.
	if _, err := cli.ExecResize(ctx, ex.ID, client.ExecResizeOptions{Width: 1000, Height: 24}); err != nil {
		b.Fatal(err)
	}
	// The floor of any process in the path: a relay that copies the bytes
	// of its own TTY exec of bash, in the same container.
	relayBin, err := testExecRelay()
	if err != nil {
		b.Fatal(err)
	}
	rcmd := exec.Command(relayBin, ids[0])
	rcmd.Stderr = os.Stderr
	rout, err := rcmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := rcmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer rcmd.Wait()
	addr, err := bufio.NewReader(rout).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	relay, err := net.Dial("tcp", strings.TrimSpace(addr))
	if err != nil {
		b.Fatal(err)
	}
	defer relay.Close()

	buf := make([]byte, 4096)
	// typer returns a func that writes keys to w and reads r until the
	// last one echoes.
	typer := func(w io.Writer, r io.Reader) func(string) {
		return func(keys string) {
			if _, err := w.Write([]byte(keys)); err != nil {
				b.Fatal(err)
			}
			for {
				n, err := r.Read(buf)
				if bytes.IndexByte(buf[:n], keys[len(keys)-1]) >= 0 {
					return
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	typeBare, typeRelayed := typer(att.Conn, att.Reader), typer(relay, relay)
	typeBare("true\r")
	typeRelayed("true\r")

	// Every 500 keys the lines are cleared (^U); an X typed after the
	// clear marks its redraw done, so no redraw is taken for an echo.
	var viaAHP, relayed, direct []time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%500 == 0 {
			press("\x15X")
			typeRelayed("\x15X")
			typeBare("\x15X")
		}
		k := string(rune('a' + i%26))
		t0 := time.Now()
		press(k)
		viaAHP = append(viaAHP, time.Since(t0))

		t0 = time.Now()
		typeRelayed(k)
		relayed = append(relayed, time.Since(t0))

		t0 = time.Now()
		typeBare(k)
		direct = append(direct, time.Since(t0))
	}
	ap, rp, dp := p50(viaAHP), p50(relayed), p50(direct)
	b.ReportMetric(float64(ap)/1e3, "ahp-p50-µs")
	b.ReportMetric(float64(rp)/1e3, "copy-relay-p50-µs")
	b.ReportMetric(float64(dp)/1e3, "bare-p50-µs")
	b.ReportMetric(float64(ap)/float64(dp), "ahp/bare")
	b.ReportMetric(float64(rp)/float64(dp), "copy-relay/bare")
	b.ReportMetric(float64(ap)/float64(rp), "ahp/copy-relay")
}

// BenchmarkAHPTrim prints 500 MB in a terminal and reports how much content
// its state holds against the configured cap, and sandboxd's memory.
func BenchmarkAHPTrim(b *testing.B) {
	ws := workspace(b)
	const maxContent = 1 << 20
	a := startAHP(b, ws, "--ahp-max-content", "1MiB")
	const term = "ahp-terminal:/trim"
	c := terminalClient(b, a, "trim", term, ws)
	rssBefore := procStatus(b, a.srv.cmd.Process.Pid, "VmRSS")
	start := time.Now()
	// Not subscribed: the client does not read 500 MB; the server still
	// keeps the terminal's state. Exit the shell when done.
	c.input(term, "head -c 500000000 /dev/zero | tr '\\0' x; exit\r", 1)
	var state struct {
		Snapshot struct {
			State TerminalStateJSON `json:"state"`
		} `json:"snapshot"`
	}
	eventually(b, "500 MB printed", 10*time.Minute, func() bool {
		r := c.call("subscribe", map[string]any{"channel": term})
		c.notify("unsubscribe", map[string]any{"channel": term})
		// Fresh each time: decoding into the last one would keep its fields.
		state.Snapshot.State = TerminalStateJSON{}
		json.Unmarshal(r.Result, &state)
		return state.Snapshot.State.ExitCode != nil
	})
	elapsed := time.Since(start)
	text := state.Snapshot.State.text()
	total := len(text)
	if total > maxContent {
		b.Errorf("terminal holds %d bytes of content, cap %d", total, maxContent)
	}
	if !strings.Contains(text[max(0, len(text)-1000):], "xxxx") {
		b.Errorf("the tail of the output is not kept: %q", text[max(0, len(text)-1000):])
	}
	rssGrowth := procStatus(b, a.srv.cmd.Process.Pid, "VmHWM") - rssBefore

	// The baseline: the same output through a bare TTY exec in the same
	// container, read and thrown away.
	ids := containersOf(b, a.srv.cmd.Process.Pid)
	if len(ids) != 1 {
		b.Fatalf("containers = %v", ids)
	}
	ctx := context.Background()
	start = time.Now()
	ex, err := testEnv.cli.ExecCreate(ctx, ids[0], client.ExecCreateOptions{User: "1000:1000", TTY: true, AttachStdout: true, AttachStderr: true, Cmd: []string{"sh", "-c", "head -c 500000000 /dev/zero | tr '\\0' x"}})
	if err != nil {
		b.Fatal(err)
	}
	att, err := testEnv.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{TTY: true})
	if err != nil {
		b.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, att.Reader)
	att.Close()
	bare := time.Since(start)
	if n < 500000000 {
		b.Fatalf("bare exec printed %d bytes", n)
	}

	b.ReportMetric(float64(total)/(1<<20), "content-MiB")
	b.ReportMetric(float64(maxContent)/(1<<20), "cap-MiB")
	b.ReportMetric(500/elapsed.Seconds(), "ahp-MB/s")
	b.ReportMetric(500/bare.Seconds(), "bare-MB/s")
	b.ReportMetric(bare.Seconds()/elapsed.Seconds(), "ahp/bare-throughput")
	b.ReportMetric(float64(rssGrowth)/(1<<20), "rss-growth-MiB")
}

// TerminalStateJSON is what tests read of a terminal snapshot.
type TerminalStateJSON struct {
	ExitCode *int   `json:"exitCode"`
	Title    string `json:"title"`
	Content  []struct {
		Value  string `json:"value"`
		Output string `json:"output"`
	} `json:"content"`
}

// text is the terminal's content as it was shown.
func (s TerminalStateJSON) text() string {
	var b strings.Builder
	for _, p := range s.Content {
		b.WriteString(p.Value)
		b.WriteString(p.Output)
	}
	return b.String()
}
