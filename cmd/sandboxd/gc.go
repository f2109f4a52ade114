package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/sandboxd/sandboxd/internal/engine"
	"github.com/sandboxd/sandboxd/sandbox"
)

// cmdGC removes the containers of sandboxd instances gone (or, with --all,
// of every instance) and prints what it removed.
func cmdGC(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("gc", "gc [--all]",
		"Removes the containers of sandboxd instances that are no longer running\n(every start does this too).", stderr)
	all := fs.Bool("all", false, "remove every sandboxd container, even of instances still running")
	if err := parseNoArgs(fs, args, stdout); err != nil {
		return err
	}
	cli, err := engine.New()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	removed, err := sandbox.GC(ctx, cli, log, sandbox.GCOptions{All: *all})
	var out bytes.Buffer
	for _, id := range removed {
		fmt.Fprintf(&out, "removed %.12s\n", id)
	}
	// A count is only known once the containers were listed: without the
	// engine, "0 removed" would be a claim about containers never seen.
	if err == nil || errors.As(err, new(*sandbox.RemoveError)) {
		fmt.Fprintf(&out, "%d container(s) removed\n", len(removed))
	}
	if _, werr := stdout.Write(out.Bytes()); werr != nil {
		err = errors.Join(err, fmt.Errorf("write: %w", werr))
	}
	return err
}
