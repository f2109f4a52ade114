package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
)

// TestErrorSaysWhatToDo: an engine that cannot be reached is reported with
// what to do about it; the socket's path comes from the client.
func TestErrorSaysWhatToDo(t *testing.T) {
	cli, err := client.New(client.WithHost("unix:///nonexistent/docker.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if got := Socket(cli); got != "/nonexistent/docker.sock" {
		t.Errorf("Socket = %q, want /nonexistent/docker.sock", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cli.Ping(ctx, PingOptions{})
	if err == nil {
		t.Fatal("ping of a missing socket succeeded")
	}
	if msg := Error(err).Error(); !strings.Contains(msg, "is the Docker Engine running?") {
		t.Errorf("Error(%v) = %q, want advice to start the engine", err, msg)
	}
	if other := context.Canceled; Error(other) != other {
		t.Errorf("Error(%v) changed an error that is not the engine's", other)
	}
}

// TestSocketOfTCP: an engine reached over TCP has no socket to hide.
func TestSocketOfTCP(t *testing.T) {
	cli, err := client.New(client.WithHost("tcp://127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if got := Socket(cli); got != "" {
		t.Errorf("Socket = %q, want none", got)
	}
}
