package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/sandbox"
)

// hugeArgsCreate is the decoding amplifier of issue 23: a terminal/create
// whose args are 1.39 million empty strings, 4.17 MB in all (just under
// the 4 MiB a request may have), which a decoder that builds before it
// counts turns into some 130 MB.
func hugeArgsCreate(id int) []byte {
	const n = 1_390_000
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":"terminal/create","params":{"sessionId":"amp","command":"true","args":[`, id)
	b.WriteString(strings.Repeat(`"",`, n-1))
	b.WriteString(`""]}}` + "\n")
	return b.Bytes()
}

// cpuTime is the CPU time process pid has used, user and system.
func cpuTime(t testing.TB, pid int) time.Duration {
	t.Helper()
	_, f, ok := procStat(pid)
	if !ok || len(f) < 13 {
		t.Fatalf("no /proc/%d/stat", pid)
	}
	// utime and stime, fields 14 and 15 of stat, in clock ticks (100 a
	// second on Linux).
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// maxDecodingRSS bounds sandboxd's peak resident memory while peers
// pipeline hugeArgsCreate: what requests hold is bounded per connection
// and per instance (acp/limit.go), and a request's arrays are counted
// before anything is built from them (acp/params.go).
const maxDecodingRSS = 512 << 20

// TestPipelinedHugeArgsAreRefusedCheaply: 40 pipelined creates of 1.39M
// empty args each, on one stdio connection, are each refused with an
// error naming args, cost little CPU and never take sandboxd's memory
// past maxDecodingRSS; no session is opened for them, and the connection
// goes on working.
func TestPipelinedHugeArgsAreRefusedCheaply(t *testing.T) {
	srv := startServe(t, workspace(t))
	pid := srv.cmd.Process.Pid
	c := srv.raw()
	cpu := cpuTime(t, pid)
	const n = 40
	sent := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := srv.stdin.Write(hugeArgsCreate(100 + i)); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	for range n {
		rep := c.recv(t)
		if rep.Error == nil {
			t.Fatalf("reply %s: a create of 1.39M args was taken: %.200s", rep.ID, rep.Result)
		}
		// Refused as a command that cannot run, or for what the
		// connection holds already: never started.
		if !(rep.Error.Code == -32602 && strings.Contains(rep.Error.Message, "args")) && rep.Error.Code != -32800 {
			t.Errorf("reply %s: %d %s, want -32602 naming args or -32800", rep.ID, rep.Error.Code, rep.Error.Message)
		}
	}
	if err := <-sent; err != nil {
		t.Fatalf("send: %v", err)
	}
	used := cpuTime(t, pid) - cpu
	peak := procStatus(t, pid, "VmHWM")
	t.Logf("40 creates of 1.39M args: sandboxd peak RSS %d MiB, %v of CPU", peak>>20, used)
	if !raceEnabled {
		// The race detector multiplies both.
		if peak > maxDecodingRSS {
			t.Errorf("peak RSS %d MiB, want under %d MiB", peak>>20, maxDecodingRSS>>20)
		}
		// Building them took 46s.
		if used > 6*time.Second {
			t.Errorf("refusing them took %v of CPU, want under 6s", used)
		}
	}
	if ids := containersOf(t, pid); len(ids) > 0 {
		t.Errorf("refused creates opened %d container(s)", len(ids))
	}
	if rep := c.call(t, 1, "terminal/create", map[string]any{"sessionId": "amp", "command": "true"}); rep.Error != nil {
		t.Errorf("a create after them: %+v", rep.Error)
	}
}

// TestRequestsOfAllConnectionsShareOneBound: what requests hold while
// they wait for their answer is bounded per instance, not only per
// connection: eight unix-socket connections each pipeline 20
// terminal/wait_for_exit requests of 4 MB (a padding member the request
// keeps as it was sent) for a command that runs on. Each connection alone
// could hold 16 of them (64 MiB); all together hold no more than the
// instance's 128 MiB (sandbox.MaxRequestMemory), the rest refused with
// -32800 saying so, and sandboxd stays under maxDecodingRSS.
func TestRequestsOfAllConnectionsShareOneBound(t *testing.T) {
	srv, sock := startServeUnix(t)
	ws, pid := srv.cmd.Dir, srv.cmd.Process.Pid
	const conns, n = 8, 20
	pad := strings.Repeat("x", 4_000_000)
	type peer struct {
		c    net.Conn
		r    *bufio.Reader
		wait []byte // n requests, then a probe
		seen int    // replies read
	}
	peers := make([]*peer, conns)
	recv := func(p *peer) rawReply {
		t.Helper()
		p.c.SetReadDeadline(time.Now().Add(2 * time.Minute))
		line, err := p.r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		var rep rawReply
		if err := json.Unmarshal(line, &rep); err != nil {
			t.Fatalf("recv %.200s: %v", line, err)
		}
		return rep
	}
	for i := range peers {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		p := &peer{c: c, r: bufio.NewReaderSize(c, 1<<16)}
		fmt.Fprintf(c, `{"jsonrpc":"2.0","id":1,"method":"terminal/create","params":{"sessionId":"s","command":"while [ ! -e go ]; do sleep 0.1; done"}}`+"\n")
		rep := recv(p)
		var res struct{ TerminalID string }
		if rep.Error != nil || json.Unmarshal(rep.Result, &res) != nil {
			t.Fatalf("create: %+v %s", rep.Error, rep.Result)
		}
		var b bytes.Buffer
		for j := range n {
			fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":"terminal/wait_for_exit","params":{"sessionId":"s","terminalId":%q,"_meta":{"pad":%q}}}`+"\n", 100+j, res.TerminalID, pad)
		}
		// Answered once all before it are taken or refused.
		fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":"probe","method":"terminal/kill","params":{"sessionId":"s","terminalId":"none"}}`+"\n")
		p.wait = b.Bytes()
		peers[i] = p
	}
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() { p.c.Write(p.wait) })
	}
	// Every connection's requests are read, and taken or refused.
	held, refused := 0, 0
	count := func(rep rawReply) {
		switch {
		case string(rep.ID) == `"probe"`:
		case rep.Error == nil:
			held++
		case rep.Error.Code == -32800:
			if strings.Contains(rep.Error.Message, "all of sandboxd's connections") {
				refused++
			}
		default:
			t.Errorf("wait %s: %+v", rep.ID, rep.Error)
		}
	}
	// The probe's answer comes once every request before it was taken
	// or refused: those taken are all waiting then.
	for _, p := range peers {
		for {
			rep := recv(p)
			p.seen++
			if rep.Error == nil && string(rep.ID) != `"probe"` {
				t.Fatalf("wait %s answered while the command runs: %s", rep.ID, rep.Result)
			}
			count(rep)
			if string(rep.ID) == `"probe"` {
				break
			}
		}
	}
	wg.Wait()
	peak := procStatus(t, pid, "VmHWM")
	// The command ends: every wait taken is answered.
	writeFile(t, filepath.Join(ws, "go"), "")
	for _, p := range peers {
		for ; p.seen < n+1; p.seen++ {
			count(recv(p))
		}
	}
	t.Logf("%d connections of %d waits of 4 MB: %d held at once, %d refused for the instance's bound; peak RSS %d MiB", conns, n, held, refused, peak>>20)
	if max := sandbox.MaxRequestMemory / len(pad); held > max || refused == 0 {
		t.Errorf("%d waits held at once, %d refused for all connections; want at most %d held", held, refused, max)
	}
	if !raceEnabled && peak > maxDecodingRSS {
		t.Errorf("peak RSS %d MiB, want under %d MiB", peak>>20, maxDecodingRSS>>20)
	}
	srv.cmd.Process.Signal(syscall.SIGTERM) // on a socket stdin is not the peer
	<-srv.done
}

// TestSlowReaderOfLargeOutputs: four terminals hold 16 MiB of \x01 each,
// six bytes apiece in JSON, and a peer that reads slowly asks for their
// output 40 times. sandboxd writes each answer as it encodes it, so the
// answers hold a copy of the output of each of the two a connection
// writes at once and what is encoded at a time, not 40 answers of 96 MiB
// (nor, as before, two of them built whole, with their copies): its peak
// stays under maxOutputRSS, and every answer is whole and right.
func TestSlowReaderOfLargeOutputs(t *testing.T) {
	srv := startServeWithConfig(t, workspace(t), "[terminal]\nmax_output_byte_limit = \"16MiB\"\n")
	pid := srv.cmd.Process.Pid
	c := srv.raw()
	const size = 16 << 20
	ids := make([]string, 4)
	for i := range ids {
		rep := c.call(t, i+1, "terminal/create", map[string]any{"sessionId": "big", "command": `head -c 16777216 /dev/zero | tr '\0' '\1'`, "outputByteLimit": size})
		var res struct{ TerminalID string }
		if rep.Error != nil || json.Unmarshal(rep.Result, &res) != nil {
			t.Fatalf("create: %+v %s", rep.Error, rep.Result)
		}
		ids[i] = res.TerminalID
		if rep := c.call(t, 10+i, "terminal/wait_for_exit", map[string]any{"sessionId": "big", "terminalId": ids[i]}); rep.Error != nil {
			t.Fatalf("wait: %+v", rep.Error)
		}
	}
	// The peak from here on: the kernel's high-water mark starts again
	// at what sandboxd holds now.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	base := procStatus(t, pid, "VmRSS")
	const n = 40
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":"terminal/output","params":{"sessionId":"big","terminalId":%q}}`+"\n", 100+i, ids[i%len(ids)])
	}
	if _, err := srv.stdin.Write(b.Bytes()); err != nil {
		t.Fatal(err)
	}
	// Slow: nothing is read until sandboxd is blocked writing.
	pipe, err := srv.stdout.(*os.File).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "sandboxd's answers filling the pipe", time.Minute, func() bool {
		queued := 0
		pipe.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
		return queued >= 64<<10
	})
	want := []byte(`{"output":"` + strings.Repeat(`\u0001`, size) + `","truncated":false,"exitStatus":{"exitCode":0,"signal":null}}`)
	for range n {
		if rep := c.recv(t); rep.Error != nil || !bytes.Equal(rep.Result, want) {
			t.Fatalf("answer %s: %+v, %d bytes of result, want %d", rep.ID, rep.Error, len(rep.Result), len(want))
		}
	}
	peak := procStatus(t, pid, "VmHWM")
	t.Logf("40 outputs of 16 MiB to a slow reader: sandboxd peak RSS %d MiB, from %d MiB", peak>>20, base>>20)
	if !raceEnabled && peak > maxOutputRSS {
		t.Errorf("peak RSS %d MiB, want under %d MiB", peak>>20, maxOutputRSS>>20)
	}
}

// maxOutputRSS bounds sandboxd's peak in TestSlowReaderOfLargeOutputs.
// What is live then is the four buffers (64 MiB) and the copies of the
// two answers being written (32 MiB); the garbage collector lets the heap
// grow to twice what is live before it collects, and the runtime has some
// of its own. Two answers built whole, as before, held some 450 MiB.
const maxOutputRSS = 256 << 20

// hostMemory is the memory of the engine's host, as the engine reports
// it: what the default memory budget is a share of.
func hostMemory(t *testing.T) int64 {
	t.Helper()
	info, err := testEnv.cli.Info(context.Background(), client.InfoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return info.Info.MemTotal
}

// TestMemoryBudgetOfTheHost: the memory limits of an instance's sessions
// never add up to more than the default budget, 75% of the host's memory:
// sessions of 4GiB (16 of them were taken on a 24GiB host) open until the
// next would go over it, which is refused with -32800 saying what the
// budget is and what is committed; so is an implicit open past it; a
// session closed makes room again.
func TestMemoryBudgetOfTheHost(t *testing.T) {
	ws := workspace(t)
	srv := startServeWithConfig(t, ws, "[server]\nmax_sessions = 64\n")
	c := srv.raw()
	budget := int64(float64(hostMemory(t)) * 75 / 100)
	fit := int(budget / (4 << 30))
	open := func(id int, sid string) rawReply {
		return c.call(t, id, "_sandboxd/session/open", map[string]any{"sessionId": sid, "cwd": ws, "memory": "4GiB"})
	}
	for i := range fit {
		if rep := open(i+1, fmt.Sprint("big", i)); rep.Error != nil {
			t.Fatalf("session %d of 4GiB, with %d fitting the budget: %+v", i, fit, rep.Error)
		}
	}
	rep := open(100, "over")
	want := fmt.Sprintf("(server.memory_budget, 75%% of the host's %s); %d sessions commit %dGiB", roundGiB(hostMemory(t)), fit, 4*fit)
	if rep.Error == nil || rep.Error.Code != -32800 || !strings.Contains(rep.Error.Message, want) {
		t.Fatalf("a session past the budget: %+v, want -32800 saying %q", rep.Error, want)
	}
	t.Logf("session %d of 4GiB: %s", fit+1, rep.Error.Message)
	if n := len(containersOf(t, srv.cmd.Process.Pid)); n != fit {
		t.Errorf("%d containers, want %d", n, fit)
	}
	// Implicit opens, of the default 1GiB, until the budget is full.
	implicit := int((budget - int64(fit)<<32) / (1 << 30))
	for i := range implicit + 1 {
		rep := c.call(t, 200+i, "terminal/create", map[string]any{"sessionId": fmt.Sprint("small", i), "command": "true"})
		if i < implicit && rep.Error != nil {
			t.Fatalf("implicit open %d, with %d fitting: %+v", i, implicit, rep.Error)
		}
		if i == implicit && (rep.Error == nil || rep.Error.Code != -32800 || !strings.Contains(rep.Error.Message, "server.memory_budget")) {
			t.Fatalf("an implicit open past the budget: %+v, want -32800 naming server.memory_budget", rep.Error)
		}
	}
	if rep := c.call(t, 300, "_sandboxd/session/close", map[string]any{"sessionId": "big0"}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	if rep := open(301, "again"); rep.Error != nil {
		t.Errorf("a session once another closed: %+v", rep.Error)
	}
}

// roundGiB shows a size as sandboxd's messages do: whole GiB, or to a
// tenth of one.
func roundGiB(n int64) string {
	if n%(1<<30) == 0 {
		return fmt.Sprintf("%dGiB", n>>30)
	}
	return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + "GiB"
}

// TestRunRefusesMemoryItCannotHave: `sandboxd run --memory` above the
// host's memory, or above the memory budget, is a bad flag, refused before
// any container starts; a configuration whose default session memory is
// above the budget does not start.
func TestRunRefusesMemoryItCannotHave(t *testing.T) {
	ws := workspace(t)
	cfg := filepath.Join(t.TempDir(), "sandbox.toml")
	writeFile(t, cfg, "[session.max]\nmemory = \"1TiB\"\n")
	host := hostMemory(t)
	between := (host * 9 / 10) &^ (1<<20 - 1) // over the 75% budget, under the host
	for _, tc := range []struct{ memory, want string }{
		{"1TiB", fmt.Sprintf("--memory 1TiB is more than the %s of memory the engine's host has", roundGiB(host))},
		{fmt.Sprintf("%dMiB", between>>20), fmt.Sprintf("--memory %s is more than the memory budget of", roundGiB(between))},
	} {
		r := runSandboxd(t, ws, nil, nil, "run", "--config", cfg, "--memory", tc.memory, "--", "true")
		t.Logf("run --memory %s: %s", tc.memory, strings.TrimSpace(r.stderr))
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("run --memory %s: exit %d, %q; want 2 saying %q", tc.memory, r.code, r.stderr, tc.want)
		}
		assertNoContainers(t, r.pid)
	}
	writeFile(t, cfg, "[server]\nmemory_budget = \"512MiB\"\n")
	r := runSandboxd(t, ws, nil, nil, "run", "--config", cfg, "--", "true")
	if want := "session.memory: 1GiB is more than the memory budget of 512MiB (server.memory_budget)"; r.code != 125 || !strings.Contains(r.stderr, want) {
		t.Errorf("run with session.memory over the budget: exit %d, %q; want 125 saying %q", r.code, r.stderr, want)
	}
	assertNoContainers(t, r.pid)
}
