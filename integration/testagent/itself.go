package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

// runItself runs line with the agent's own shell, as agents whose shell
// tool runs in their own process do, and shows it as they do: a tool call
// of kind execute with the output as text.
func (a *agent) runItself(ctx context.Context, sid acp.SessionId, cwd, line string) (string, error) {
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", line)
	cmd.Dir = cwd
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			return "", err
		}
		code = ee.ExitCode()
	}
	b := make([]byte, 6)
	rand.Read(b)
	err = a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.StartToolCall(acp.ToolCallId("own_"+hex.EncodeToString(b)), line,
		acp.WithStartKind(acp.ToolKindExecute), acp.WithStartStatus(acp.ToolCallStatusCompleted),
		acp.WithStartContent([]acp.ToolCallContent{acp.ToolContent(acp.TextBlock(string(out)))}))})
	return fmt.Sprintf("exit=%d output=%s", code, out), err
}

// proxyURL is the proxy the environment names for scheme's requests,
// used also for localhost, which Go's own reading of it leaves out.
func proxyURL(name string) (*url.URL, error) {
	v := os.Getenv(name)
	if v == "" {
		return nil, fmt.Errorf("%s is not set", name)
	}
	return url.Parse(v)
}

func get(ctx context.Context, target string) string {
	proxy, err := proxyURL("HTTP_PROXY")
	if err != nil {
		return "error: " + err.Error()
	}
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return "error: " + err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return fmt.Sprintf("status=%d body=%s", resp.StatusCode, strings.TrimSpace(string(b)))
}

func dial(addr string) string {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "dial: " + err.Error()
	}
	c.Close()
	return "dial: ok"
}

func lookup(ctx context.Context, name string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return "lookup: error: " + err.Error()
	}
	return "lookup: " + strings.Join(addrs, " ")
}

// download reads all dest sends, through a CONNECT tunnel of the proxy.
func download(dest string) string {
	proxy, err := proxyURL("HTTPS_PROXY")
	if err != nil {
		return "error: " + err.Error()
	}
	start := time.Now()
	c, err := net.DialTimeout("tcp", proxy.Host, 5*time.Second)
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
	br := bufio.NewReaderSize(c, 256<<10)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return "error: " + err.Error()
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("error: CONNECT: %s", resp.Status)
	}
	n, err := io.CopyBuffer(io.Discard, br, make([]byte, 256<<10))
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("bytes=%d ns=%d", n, time.Since(start).Nanoseconds())
}
