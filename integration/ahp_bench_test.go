package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
)

// BenchmarkAHPKeystroke compares the keystroke round trip through the AHP
// channel (terminal/input sent to the echoed terminal/data received) with a
// bare Engine API TTY exec of bash in the same container, interleaved.
func BenchmarkAHPKeystroke(b *testing.B) {
	ws := workspace(b)
	a := startAHP(b, ws)
	c, err := dialAHP(b, a, nil)
	if err != nil {
		b.Fatal(err)
	}
	c.initialize("bench")
	const term = "ahp-terminal:/bench"
	if r := c.call("createTerminal", map[string]any{"channel": term, "claim": map[string]any{"kind": "client", "clientId": "bench"}, "cwd": "file://" + ws}); r.Error != nil {
		b.Fatal(r.Error)
	}
	c.call("subscribe", map[string]any{"channel": term})
	eventually(b, "prompt", time.Minute, func() bool { return strings.Contains(c.data(term), "$ ") })
	ids := containersOf(b, a.srv.cmd.Process.Pid)
	if len(ids) != 1 {
		b.Fatalf("containers = %v", ids)
	}
	ctx := context.Background()
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
	bare := make(chan byte, 1<<16)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := att.Reader.Read(buf)
			for _, ch := range buf[:n] {
				bare <- ch
			}
			if err != nil {
				return
			}
		}
	}()
	waitByte := func(want byte) {
		for ch := range bare {
			if ch == want {
				return
			}
		}
	}
	seq := 100
	const keys = 100
	var viaAHP, direct []time.Duration
	for range b.N {
		for i := range keys {
			k := byte('a' + i%26)
			before := len(c.data(term))
			t0 := time.Now()
			seq++
			c.input(term, string(k), seq)
			for {
				c.mu.Lock()
				ch := c.changed
				c.mu.Unlock()
				if d := c.data(term); len(d) > before && strings.IndexByte(d[before:], k) >= 0 {
					break
				}
				<-ch
			}
			viaAHP = append(viaAHP, time.Since(t0))

			t0 = time.Now()
			if _, err := att.Conn.Write([]byte{k}); err != nil {
				b.Fatal(err)
			}
			waitByte(k)
			direct = append(direct, time.Since(t0))
		}
		// Clear both command lines.
		c.input(term, "\x15", seq+1)
		att.Conn.Write([]byte{0x15})
	}
	b.ReportMetric(float64(p50(viaAHP))/1e3, "ahp-p50-µs")
	b.ReportMetric(float64(p50(direct))/1e3, "bare-p50-µs")
	b.ReportMetric(float64(p50(viaAHP))/float64(p50(direct)), "ahp/bare")
}

// BenchmarkAHPTrim prints 500 MB in a terminal and reports how much content
// its state holds against the configured cap, and sandboxd's memory.
func BenchmarkAHPTrim(b *testing.B) {
	ws := workspace(b)
	const maxContent = 1 << 20
	a := startAHP(b, ws, "--ahp-max-content", "1MiB")
	c, err := dialAHP(b, a, nil)
	if err != nil {
		b.Fatal(err)
	}
	c.initialize("trim")
	const term = "ahp-terminal:/trim"
	if r := c.call("createTerminal", map[string]any{"channel": term, "claim": map[string]any{"kind": "client", "clientId": "trim"}, "cwd": "file://" + ws}); r.Error != nil {
		b.Fatal(r.Error)
	}
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
		json.Unmarshal(r.Result, &state)
		return state.Snapshot.State.ExitCode != nil
	})
	elapsed := time.Since(start)
	total := 0
	for _, p := range state.Snapshot.State.Content {
		total += len(p.Value) + len(p.Output)
	}
	if total > maxContent {
		b.Errorf("terminal holds %d bytes of content, cap %d", total, maxContent)
	}
	if !bytes.Contains([]byte(state.Snapshot.State.Content[len(state.Snapshot.State.Content)-1].Output+state.Snapshot.State.Content[len(state.Snapshot.State.Content)-1].Value), []byte("xxxx")) {
		b.Errorf("the tail of the output is not kept")
	}
	b.ReportMetric(float64(total)/(1<<20), "content-MiB")
	b.ReportMetric(float64(maxContent)/(1<<20), "cap-MiB")
	b.ReportMetric(500/elapsed.Seconds(), "MB/s")
	b.ReportMetric(float64(procStatus(b, a.srv.cmd.Process.Pid, "VmHWM")-rssBefore)/(1<<20), "rss-growth-MiB")
}

// TerminalStateJSON is what the benchmark reads of a terminal snapshot.
type TerminalStateJSON struct {
	ExitCode *int `json:"exitCode"`
	Content  []struct {
		Value  string `json:"value"`
		Output string `json:"output"`
	} `json:"content"`
}
