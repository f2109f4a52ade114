package integration

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/sandbox"
)

// testRelay builds integration/testrelay once per test binary.
var testRelay = sync.OnceValues(func() (string, error) { return buildHelper("testrelay") })

// startPair starts argv (the agent, or a relay in front of it) and
// connects an editor to it, with one session open in ws.
func startPair(b *testing.B, ws string, argv ...string) (*acpsdk.ClientSideConnection, acpsdk.SessionId) {
	b.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = ws
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	conn := acpsdk.NewClientSideConnection(&editor{t: b, changed: make(chan struct{})}, in, out)
	conn.SetLogger(quietLog)
	ctx := context.Background()
	if _, err := conn.Initialize(ctx, acpsdk.InitializeRequest{ProtocolVersion: acpsdk.ProtocolVersionNumber}); err != nil {
		b.Fatal(err)
	}
	res, err := conn.NewSession(ctx, acpsdk.NewSessionRequest{Cwd: ws, McpServers: []acpsdk.McpServer{}})
	if err != nil {
		b.Fatal(err)
	}
	return conn, res.SessionId
}

// BenchmarkWrapRelay compares 10,000 small request/response round trips
// from an editor to the agent through `sandboxd wrap` with the same editor
// and agent connected directly, with a relay that only copies lines
// (testrelay), the floor for any process in the path. The three take
// turns in blocks of 100 so all see the same machine. It also reports
// wrap's CPU time per round trip.
func BenchmarkWrapRelay(b *testing.B) {
	const trips, block = 10000, 100
	agentBin, err := testAgent()
	if err != nil {
		b.Fatal(err)
	}
	relayBin, err := testRelay()
	if err != nil {
		b.Fatal(err)
	}
	ws := workspace(b)
	type pair struct {
		conn *acpsdk.ClientSideConnection
		sid  acpsdk.SessionId
		pid  int // of wrap
		d    []time.Duration
	}
	direct, relay := &pair{}, &pair{}
	direct.conn, direct.sid = startPair(b, ws, agentBin)
	relay.conn, relay.sid = startPair(b, ws, relayBin, agentBin)
	w := startWrapWith(b, ws, acpsdk.ClientCapabilities{}, false)
	wrapped := &pair{conn: w.conn, sid: w.newSession(b, context.Background(), ws), pid: w.cmd.Process.Pid}
	ctx := context.Background()
	cpu0 := procCPU(b, wrapped.pid)
	for range b.N {
		for range trips / block {
			for _, p := range []*pair{direct, relay, wrapped} {
				for range block {
					t0 := time.Now()
					if _, err := p.conn.SetSessionMode(ctx, acpsdk.SetSessionModeRequest{SessionId: p.sid, ModeId: "default"}); err != nil {
						b.Fatal(err)
					}
					p.d = append(p.d, time.Since(t0))
				}
			}
		}
	}
	cpu := procCPU(b, wrapped.pid) - cpu0
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	dp, rp, wp := p50(direct.d), p50(relay.d), p50(wrapped.d)
	b.ReportMetric(us(dp), "direct-p50-µs")
	b.ReportMetric(us(rp), "copy-relay-p50-µs")
	b.ReportMetric(us(wp), "wrap-p50-µs")
	b.ReportMetric(float64(wp)/float64(dp), "wrap/direct")
	b.ReportMetric(float64(rp)/float64(dp), "copy-relay/direct")
	b.ReportMetric(float64(wp)/float64(rp), "wrap/copy-relay")
	b.ReportMetric(us(cpu)/float64(b.N*trips), "wrap-cpu-µs/trip")
}

// procCPU returns the CPU time a process has used, its threads' together.
func procCPU(b testing.TB, pid int) time.Duration {
	b.Helper()
	_, f, ok := procStat(pid)
	if !ok || len(f) < 13 {
		b.Fatalf("no /proc/%d/stat", pid)
	}
	// utime and stime, fields 14 and 15 of the line (11 and 12 after the
	// name), in USER_HZ: 100 a second on Linux.
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// BenchmarkWrapFirstCommand measures, through wrap, how long after
// session/new is answered the editor sees the first output of `echo`: for
// a session that finds the spare container running, for one that needs a
// cold start, and for a session whose container was already running.
func BenchmarkWrapFirstCommand(b *testing.B) {
	ctx := context.Background()
	ws := workspace(b)
	elsewhere := workspace(b) // the spare is made for ws only
	w := startWrap(b, ws, acpsdk.ClientCapabilities{})
	run := 0
	// firstOutput runs a uniquely marked echo, so that late updates of
	// earlier runs are never taken for its output.
	firstOutput := func(sid acpsdk.SessionId, t0 time.Time) time.Duration {
		run++
		mark := fmt.Sprintf("hi-%d\n", run)
		before := len(w.ed.rawUpdates())
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.conn.Prompt(ctx, acpsdk.PromptRequest{SessionId: sid, Prompt: []acpsdk.ContentBlock{acpsdk.TextBlock("run echo " + strings.TrimSpace(mark))}})
		}()
		for {
			w.ed.mu.Lock()
			raw := w.ed.raw[before:]
			changed := w.ed.changed
			w.ed.mu.Unlock()
			var mine []string
			for _, r := range raw {
				if strings.Contains(r, `"sessionId":"`+string(sid)+`"`) {
					mine = append(mine, r)
				}
			}
			for _, text := range toolCallTexts(mine) {
				if strings.HasPrefix(text, mark) {
					d := time.Since(t0)
					<-done
					return d
				}
			}
			<-changed
		}
	}
	// With every session closed, the only container is the spare.
	spareReady := func() bool {
		ids := containersOf(b, w.cmd.Process.Pid)
		if len(ids) != 1 {
			return false
		}
		c, err := testEnv.cli.ContainerInspect(ctx, ids[0], client.ContainerInspectOptions{})
		return err == nil && c.Container.Config.Labels[sandbox.LabelSession] == "spare" && c.Container.State.Running
	}
	const sessions = 10
	var spare, cold, ready []time.Duration
	for range b.N {
		for range sessions {
			eventually(b, "spare container", time.Minute, spareReady)
			sid := w.newSession(b, ctx, ws)
			spare = append(spare, firstOutput(sid, time.Now()))
			ready = append(ready, firstOutput(sid, time.Now()))
			sid2 := w.newSession(b, ctx, elsewhere)
			cold = append(cold, firstOutput(sid2, time.Now()))
			for _, id := range []acpsdk.SessionId{sid, sid2} {
				if _, err := w.conn.CloseSession(ctx, acpsdk.CloseSessionRequest{SessionId: id}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.ReportMetric(ms(p50(spare)), "new-session-spare-p50-ms")
	b.ReportMetric(ms(p50(cold)), "new-session-cold-p50-ms")
	b.ReportMetric(ms(p50(ready)), "ready-session-p50-ms")
	b.ReportMetric(float64(p50(spare))/float64(p50(ready)), "spare/ready")
	b.ReportMetric(float64(p50(cold))/float64(p50(ready)), "cold/ready")
}
