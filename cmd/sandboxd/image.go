package main

import (
	"context"
	"errors"
	"io"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/internal/engine"
)

// cmdImage builds the base image (`image build`).
func cmdImage(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// build is its only command: its help is the command's.
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		args = []string{"build", "-h"}
	}
	if len(args) == 0 || args[0] != "build" {
		return usageError{errors.New("usage: sandboxd image build [--ref REF]")}
	}
	fs := newFlagSet("image build", "image build [--ref REF]",
		"Builds the base image from Debian's busybox-static and bash-static packages,\nreproducibly and without a registry.", stderr)
	ref := fs.String("ref", images.DefaultRef, "image reference to build")
	if err := parseNoArgs(fs, args[1:], stdout); err != nil {
		return err
	}
	cli, err := engine.New()
	if err != nil {
		return err
	}
	b := images.Builder{Client: cli, Progress: stderr}
	_, err = b.Build(ctx, *ref)
	return err
}
