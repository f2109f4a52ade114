package integration

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/sandbox"
)

// BenchmarkWrapRelay compares small request/response round trips from an
// editor to the agent through `sandboxd wrap` with the same editor and
// agent connected directly, in the same run, alternating blocks of each so
// both see the same machine.
func BenchmarkWrapRelay(b *testing.B) {
	const trips, block = 10000, 500
	ctx := context.Background()
	roundTrips := func(d []time.Duration, conn *acpsdk.ClientSideConnection, sid acpsdk.SessionId) []time.Duration {
		for range block {
			t0 := time.Now()
			if _, err := conn.SetSessionMode(ctx, acpsdk.SetSessionModeRequest{SessionId: sid, ModeId: "default"}); err != nil {
				b.Fatal(err)
			}
			d = append(d, time.Since(t0))
		}
		return d
	}
	agentBin, err := testAgent()
	if err != nil {
		b.Fatal(err)
	}
	ws := workspace(b)
	// Direct: the editor talks to the agent's own stdio.
	cmd := exec.Command(agentBin)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		in.Close()
		cmd.Wait()
	}()
	conn := acpsdk.NewClientSideConnection(&editor{t: b, changed: make(chan struct{})}, in, out)
	conn.SetLogger(quietLog)
	if _, err := conn.Initialize(ctx, acpsdk.InitializeRequest{ProtocolVersion: acpsdk.ProtocolVersionNumber}); err != nil {
		b.Fatal(err)
	}
	res, err := conn.NewSession(ctx, acpsdk.NewSessionRequest{Cwd: ws, McpServers: []acpsdk.McpServer{}})
	if err != nil {
		b.Fatal(err)
	}
	w := startWrap(b, ws, acpsdk.ClientCapabilities{})
	sid := w.newSession(b, ctx, ws)
	var direct, wrapped []time.Duration
	for range b.N {
		for range trips / block {
			direct = roundTrips(direct, conn, res.SessionId)
			wrapped = roundTrips(wrapped, w.conn, sid)
		}
	}
	b.ReportMetric(float64(p50(direct))/1e3, "direct-p50-µs")
	b.ReportMetric(float64(p50(wrapped))/1e3, "wrap-p50-µs")
	b.ReportMetric(float64(p50(wrapped))/float64(p50(direct)), "wrap/direct")
}

// BenchmarkWrapFirstCommand measures, through wrap, how long after
// session/new is answered the editor sees the first output of `echo`, and
// the same for a session whose container is already running.
func BenchmarkWrapFirstCommand(b *testing.B) {
	ctx := context.Background()
	ws := workspace(b)
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
	const sessions = 10
	spareReady := func() bool {
		for _, id := range containersOf(b, w.cmd.Process.Pid) {
			c, err := testEnv.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
			if err == nil && c.Container.Config.Labels[sandbox.LabelSession] == "spare" && c.Container.State.Running {
				return true
			}
		}
		return false
	}
	var spare, cold, warm []time.Duration
	for range b.N {
		for range sessions {
			// A session opened while the editor was idle finds the spare
			// container running.
			eventually(b, "spare container", time.Minute, spareReady)
			sid := w.newSession(b, ctx, ws)
			spare = append(spare, firstOutput(sid, time.Now()))
			warm = append(warm, firstOutput(sid, time.Now()))
			// One opened right after finds none: a cold start.
			sid2 := w.newSession(b, ctx, ws)
			cold = append(cold, firstOutput(sid2, time.Now()))
			for _, id := range []acpsdk.SessionId{sid, sid2} {
				if _, err := w.conn.CloseSession(ctx, acpsdk.CloseSessionRequest{SessionId: id}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.ReportMetric(ms(p50(spare)), "new-session-spare-p50-ms")
	b.ReportMetric(float64(p50(spare))/float64(p50(warm)), "spare/ready")
	b.ReportMetric(ms(p50(cold)), "new-session-cold-p50-ms")
	b.ReportMetric(ms(p50(warm)), "ready-session-p50-ms")
	b.ReportMetric(float64(p50(cold))/float64(p50(warm)), "cold/ready")
}
