package acp

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/sandboxd/sandboxd"
	"github.com/sandboxd/sandboxd/internal/enginetest"
	"github.com/sandboxd/sandboxd/sandbox"
)

// fakeEngine is an in-memory engine with a manager of its own.
type fakeEngine struct {
	*enginetest.Engine
	m *sandbox.Manager
}

func newFakeEngine(t *testing.T, hold ...string) *fakeEngine {
	t.Helper()
	e := &fakeEngine{Engine: enginetest.New(t, hold...)}
	cfg, err := sandbox.LoadConfig(sandboxd.DefaultConfig, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	e.m, err = sandbox.NewManager(context.Background(), e.API, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	e.CloseAtEnd(t, e.m.Close)
	return e
}

// newTerminals returns the terminal service of a new scope of m.
func newTerminals(m *sandbox.Manager, name, workspace string, defaults sandbox.SessionSpec) *Terminals {
	return NewTerminals(m.NewScope(name, workspace, defaults))
}
