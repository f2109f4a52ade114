package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	acpsdk "github.com/coder/acp-go-sdk"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
)

// BenchmarkContain measures what --contain costs, each figure against its
// baseline in the same run, the two taking turns:
//
//   - start: from starting wrap to the agent's initialize answer, contained
//     and not; and a hardened container of the same image, started and
//     removed with one exec (`true`) in it, the floor of a cold contained
//     start. Of the contained start, the part after the container is up
//     (the forwarder and the agent's exec to its answer), against the same
//     part uncontained (the agent's fork and exec to its answer);
//   - a prompt round trip through a contained wrap and an uncontained one,
//     the contained agent given the host's two CPUs (--cpus 2) as the
//     other has them;
//   - a command the agent runs itself (os/exec), in its container and on
//     the host, as the editor sees it (a prompt that runs `true`);
//   - 100 MB from a server on the host's loopback through the egress proxy
//     (CONNECT) to the contained agent, and read directly on the host.
func BenchmarkContain(b *testing.B) {
	const starts, trips, block, commands, downloads = 5, 500, 50, 30, 5
	ctx := context.Background()
	ws := workspace(b)
	src := bigServer(b, 100<<20)
	allow := fmt.Sprintf("localhost:%d", src)
	var coldC, coldU, readyC, readyU, dockerRun []time.Duration
	var hardened *container.InspectResponse
	for range b.N {
		for range starts {
			d, after := startToInitialize(b, ws)
			coldU, readyU = append(coldU, d), append(readyU, after)
			d, after, w := startContainedTimed(b, ws, allow)
			coldC, readyC = append(coldC, d), append(readyC, after)
			if hardened == nil {
				ids := containersOf(b, w.cmd.Process.Pid)
				c, err := testEnv.cli.ContainerInspect(ctx, ids[0], client.ContainerInspectOptions{})
				if err != nil {
					b.Fatal(err)
				}
				hardened = &c.Container
			}
			w.stop(b)
			dockerRun = append(dockerRun, runHardened(b, hardened))
		}
	}
	b.ReportMetric(ms(p50(coldU)), "start-uncontained-p50-ms")
	b.ReportMetric(ms(p50(coldC)), "start-contained-p50-ms")
	b.ReportMetric(ms(p50(dockerRun)), "hardened-run+exec-p50-ms")
	b.ReportMetric(float64(p50(coldC))/float64(p50(dockerRun)), "contained/run+exec")
	b.ReportMetric(ms(p50(readyU)), "agent-start-uncontained-p50-ms")
	b.ReportMetric(ms(p50(readyC)), "agent-start-in-ready-container-p50-ms")
	b.ReportMetric(ms(p50(readyC)-p50(readyU)), "contain-adds-ready-p50-ms")

	u := startWrap(b, ws, acpsdk.ClientCapabilities{})
	c := startContained(b, ws, "--allow-host", allow, "--cpus", "2")
	usid, csid := u.newSession(b, ctx, ws), c.newSession(b, ctx, ws)
	var tripU, tripC, execU, execC []time.Duration
	for range b.N {
		for range trips / block {
			for _, p := range []struct {
				w   *wrapped
				sid acpsdk.SessionId
				d   *[]time.Duration
			}{{u, usid, &tripU}, {c, csid, &tripC}} {
				for range block {
					t0 := time.Now()
					p.w.prompt(b, ctx, p.sid, "hi")
					*p.d = append(*p.d, time.Since(t0))
				}
			}
		}
		for range commands {
			t0 := time.Now()
			u.prompt(b, ctx, usid, "exec true")
			execU = append(execU, time.Since(t0))
			t0 = time.Now()
			c.prompt(b, ctx, csid, "exec true")
			execC = append(execC, time.Since(t0))
		}
	}
	b.ReportMetric(float64(p50(tripU))/1e3, "prompt-uncontained-p50-µs")
	b.ReportMetric(float64(p50(tripC))/1e3, "prompt-contained-p50-µs")
	b.ReportMetric(float64(p50(tripC))/float64(p50(tripU)), "prompt-contained/uncontained")
	b.ReportMetric(ms(p50(execU)), "own-command-host-p50-ms")
	b.ReportMetric(ms(p50(execC)), "own-command-contained-p50-ms")
	b.ReportMetric(float64(p50(execC))/float64(p50(execU)), "own-command-contained/host")

	var viaProxy, direct []float64 // MB/s
	for range b.N {
		for range downloads {
			out := c.prompt(b, ctx, csid, "download "+allow)
			var n, ns int64
			if _, err := fmt.Sscanf(out, "bytes=%d ns=%d", &n, &ns); err != nil || n != 100<<20 {
				b.Fatalf("download through the proxy: %q", out)
			}
			viaProxy = append(viaProxy, float64(n)/float64(ns)*1e3)
			direct = append(direct, downloadDirect(b, src))
		}
	}
	mbps := func(v []float64) float64 {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x * 1e3)
		}
		return float64(p50(d)) / 1e3
	}
	b.ReportMetric(mbps(direct), "download-direct-MB/s")
	b.ReportMetric(mbps(viaProxy), "download-proxy-MB/s")
	b.ReportMetric(mbps(viaProxy)/mbps(direct), "download-proxy/direct")
}

// logLine is a line of a wrap's log: its time and message.
var logLine = regexp.MustCompile(`time=(\S+) level=\S+ msg="?([^"=]+)"?`)

// logTime finds the time of the first log line with msg in a wrap's log.
func logTime(b testing.TB, logs, msg string) time.Time {
	b.Helper()
	for _, m := range logLine.FindAllStringSubmatch(logs, -1) {
		if strings.TrimSpace(m[2]) == msg {
			t, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				b.Fatal(err)
			}
			return t
		}
	}
	b.Fatalf("no log line %q in:\n%s", msg, logs)
	return time.Time{}
}

// startToInitialize starts an uncontained wrap, waits for the agent's
// initialize answer and stops it; it returns the time to the answer and
// the part of it after the agent was started.
func startToInitialize(b *testing.B, ws string) (total, after time.Duration) {
	t0 := time.Now()
	w := startWrap(b, ws, acpsdk.ClientCapabilities{})
	t1 := time.Now()
	w.stop(b)
	return t1.Sub(t0), t1.Sub(logTime(b, w.logs.String(), "agent started"))
}

// startContainedTimed starts a contained wrap and waits for the agent's
// initialize answer; it returns the time to the answer, the part of it
// after the container was up, and the wrap, still running.
func startContainedTimed(b *testing.B, ws, allow string) (total, after time.Duration, w *wrapped) {
	t0 := time.Now()
	w = startContained(b, ws, "--allow-host", allow)
	t1 := time.Now()
	return t1.Sub(t0), t1.Sub(logTime(b, w.logs.String(), "session opened")), w
}

// runHardened creates, starts and removes a container made as c was (the
// same image and hardening), with one exec of `true` in it, and returns
// the time from the create to the end of the exec.
func runHardened(b *testing.B, c *container.InspectResponse) time.Duration {
	ctx := context.Background()
	cfg := *c.Config
	cfg.Labels, cfg.Entrypoint = nil, []string{"sleep", "infinity"}
	host := *c.HostConfig
	// Not the egress gateway, whose files went with the wrap: the
	// container of a session without one.
	host.Mounts = slices.DeleteFunc(slices.Clone(host.Mounts), func(m mount.Mount) bool { return strings.HasPrefix(m.Target, "/run/sandboxd/") })
	t0 := time.Now()
	created, err := testEnv.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &cfg, HostConfig: &host})
	if err != nil {
		b.Fatal(err)
	}
	defer testEnv.cli.ContainerRemove(ctx, created.ID, client.ContainerRemoveOptions{Force: true})
	if _, err := testEnv.cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := bareExec(ctx, testEnv.cli, created.ID, "1000:1000", []string{"true"}, io.Discard); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

// bigServer serves size bytes to each connection on the host's loopback,
// then closes it, and returns its port.
func bigServer(b *testing.B, size int) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	chunk := make([]byte, 1<<20)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for sent := 0; sent < size; sent += len(chunk) {
					if _, err := c.Write(chunk[:min(len(chunk), size-sent)]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// downloadDirect reads all the server on port sends, on the host, as the
// test agent reads it through the proxy, and returns MB/s.
func downloadDirect(b *testing.B, port int) float64 {
	t0 := time.Now()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	n, err := io.CopyBuffer(io.Discard, c, make([]byte, 256<<10))
	if err != nil {
		b.Fatal(err)
	}
	return float64(n) / float64(time.Since(t0).Nanoseconds()) * 1e3
}
