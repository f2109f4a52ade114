package integration

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"
)

// bareExec runs cmd in the container the way a minimal Engine API client
// does: create, attach, drain, inspect until it is no longer running. It is
// the baseline sandboxd is measured against.
func bareExec(ctx context.Context, cli *client.Client, container, user string, cmd []string, sink io.Writer) error {
	ex, err := cli.ExecCreate(ctx, container, client.ExecCreateOptions{User: user, Cmd: cmd, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return err
	}
	att, err := cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return err
	}
	defer att.Close()
	if _, err := stdcopy.StdCopy(sink, sink, att.Reader); err != nil {
		return err
	}
	for delay := 500 * time.Microsecond; ; delay = min(delay*2, 50*time.Millisecond) {
		r, err := cli.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
		if err != nil {
			return err
		}
		if !r.Running {
			return nil
		}
		time.Sleep(delay)
	}
}

// acpExec runs a command through sandboxd: create, wait_for_exit, release.
func acpExec(ctx context.Context, a *acpsdk.AgentSideConnection, session string, req acpsdk.CreateTerminalRequest) error {
	req.SessionId = acpsdk.SessionId(session)
	created, err := a.CreateTerminal(ctx, req)
	if err != nil {
		return err
	}
	if _, err := a.WaitForTerminalExit(ctx, acpsdk.WaitForTerminalExitRequest{SessionId: req.SessionId, TerminalId: created.TerminalId}); err != nil {
		return err
	}
	_, err = a.ReleaseTerminal(ctx, acpsdk.ReleaseTerminalRequest{SessionId: req.SessionId, TerminalId: created.TerminalId})
	return err
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchSession starts sandboxd and opens a session, returning its
// container and user for the baseline to share.
func benchSession(b *testing.B) (*server, *acpsdk.AgentSideConnection, string, string) {
	ws := workspace(b)
	srv := startServe(b, ws)
	a := srv.agent()
	res, err := a.CallExtension(context.Background(), "_sandboxd/session/open", map[string]any{"sessionId": "bench", "cwd": ws})
	if err != nil {
		b.Fatal(err)
	}
	var opened struct{ Container, User string }
	if err := json.Unmarshal(res, &opened); err != nil {
		b.Fatal(err)
	}
	return srv, a, opened.Container, opened.User
}

// BenchmarkExecLatency compares create-to-exit of `true` through sandboxd's
// whole ACP path with a bare Engine API exec and the docker CLI, in the
// same container, interleaved so that both see the same machine.
func BenchmarkExecLatency(b *testing.B) {
	_, a, container, user := benchSession(b)
	ctx := context.Background()
	const runs = 60
	var viaACP, bare, cli []time.Duration
	for range b.N {
		for i := range runs {
			t0 := time.Now()
			if err := acpExec(ctx, a, "bench", acpsdk.CreateTerminalRequest{Command: "true"}); err != nil {
				b.Fatal(err)
			}
			viaACP = append(viaACP, time.Since(t0))
			t0 = time.Now()
			if err := bareExec(ctx, testEnv.cli, container, user, []string{"true"}, io.Discard); err != nil {
				b.Fatal(err)
			}
			bare = append(bare, time.Since(t0))
			if i%3 == 0 {
				t0 = time.Now()
				if out, err := exec.Command("docker", "exec", "-u", user, container, "true").CombinedOutput(); err != nil {
					b.Fatalf("docker exec: %v %s", err, out)
				}
				cli = append(cli, time.Since(t0))
			}
		}
	}
	b.ReportMetric(ms(p50(viaACP)), "acp-p50-ms")
	b.ReportMetric(ms(p50(bare)), "bare-p50-ms")
	b.ReportMetric(ms(p50(cli)), "cli-p50-ms")
	b.ReportMetric(float64(p50(viaACP))/float64(p50(bare)), "acp/bare")
	b.ReportMetric(float64(p50(cli))/float64(p50(bare)), "cli/bare")
}

// BenchmarkStream200MB compares streaming 200 MB through sandboxd with a
// 1 MiB output limit against a bare exec drained into io.Discard, and
// reports how much sandboxd's resident memory grew.
func BenchmarkStream200MB(b *testing.B) {
	srv, a, container, user := benchSession(b)
	ctx := context.Background()
	const size = 200_000_000
	cmd := []string{"head", "-c", strconv.Itoa(size), "/dev/zero"}
	rssBefore := procStatus(b, srv.cmd.Process.Pid, "VmRSS")
	var viaACP, bare []time.Duration
	for range b.N {
		for range 5 {
			t0 := time.Now()
			err := acpExec(ctx, a, "bench", acpsdk.CreateTerminalRequest{Command: cmd[0], Args: cmd[1:], OutputByteLimit: ptr(1 << 20)})
			if err != nil {
				b.Fatal(err)
			}
			viaACP = append(viaACP, time.Since(t0))
			t0 = time.Now()
			if err := bareExec(ctx, testEnv.cli, container, user, cmd, io.Discard); err != nil {
				b.Fatal(err)
			}
			bare = append(bare, time.Since(t0))
		}
	}
	peak := procStatus(b, srv.cmd.Process.Pid, "VmHWM")
	mbps := func(d time.Duration) float64 { return size / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(p50(viaACP)), "acp-MB/s")
	b.ReportMetric(mbps(p50(bare)), "bare-MB/s")
	b.ReportMetric(mbps(p50(viaACP))/mbps(p50(bare)), "acp/bare")
	b.ReportMetric(float64(peak-rssBefore)/(1<<20), "rss-growth-MiB")
}

// procStatus reads a size field of /proc/PID/status, in bytes.
func procStatus(b testing.TB, pid int, field string) int64 {
	b.Helper()
	text, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(text), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
