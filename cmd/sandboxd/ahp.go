package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/sandboxd/sandboxd/ahp"
	"github.com/sandboxd/sandboxd/sandbox"
)

// ahpFlags are the flags of the AHP terminal channel, on serve and wrap.
type ahpFlags struct {
	listen    string
	tokenFile string
	origins   stringList
	maxBytes  string
	// maxContent is maxBytes parsed by check.
	maxContent int64
}

func (a *ahpFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.listen, "ahp-listen", "", "serve the AHP terminal channel over WebSocket on `addr`, e.g. 127.0.0.1:7681")
	fs.StringVar(&a.tokenFile, "ahp-token-file", "", "where to write the AHP bearer token (default: the user cache directory's sandboxd/ahp-token-PORT)")
	fs.Var(&a.origins, "ahp-origin", "a browser origin host allowed to connect, e.g. localhost:3000 (repeatable)")
	fs.StringVar(&a.maxBytes, "ahp-max-content", "1MiB", "content kept per terminal")
}

// check parses the flags' values, before anything is started.
func (a *ahpFlags) check() error {
	max, err := parseSize(a.maxBytes)
	if err != nil {
		return usageError{fmt.Errorf("--ahp-max-content: %w", err)}
	}
	if err := ahp.CheckMaxContent(max); err != nil {
		return usageError{fmt.Errorf("--ahp-max-content: %s %w", a.maxBytes, err)}
	}
	a.maxContent = max
	return nil
}

// start serves AHP in the background when --ahp-listen is set. Terminals
// run in scope's sessions.
func (a *ahpFlags) start(ctx context.Context, scope *sandbox.Scope, log *slog.Logger, stderr io.Writer) (wait func(), err error) {
	if a.listen == "" {
		return func() {}, nil
	}
	token, err := ahp.NewToken()
	if err != nil {
		return nil, err
	}
	srv := ahp.NewServer(ctx, ahp.Config{Token: token, Origins: a.origins, MaxContent: int(a.maxContent), Workspace: scope.Workspace(), Sessions: scope.SessionFor}, log)
	var file string
	ready := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		started := false
		err := srv.Listen(ctx, a.listen, func(addr net.Addr) error {
			var err error
			if file, err = a.tokenPath(addr); err != nil {
				return err
			}
			if err := ahp.WriteToken(file, token); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "sandboxd: AHP terminal channel on %s (bearer token in %s)\n", ahp.URL(addr), file)
			if tcp, ok := addr.(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
				fmt.Fprintf(stderr, "sandboxd: warning: %s is reachable from other hosts; whoever can reach it with the token gets a shell in the sandbox\n", tcp)
			}
			started = true
			ready <- nil
			return nil
		})
		switch {
		case err != nil && !started:
			ready <- err // the command reports it
		case err != nil:
			log.Error("ahp", "err", err)
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return func() {
		<-done
		ahp.RemoveToken(file, token)
	}, nil
}

// tokenPath is --ahp-token-file, else the server's own default.
func (a *ahpFlags) tokenPath(addr net.Addr) (string, error) {
	if a.tokenFile != "" {
		return a.tokenFile, nil
	}
	file, err := ahp.TokenFile(addr)
	if err != nil {
		return "", fmt.Errorf("%w (--ahp-token-file)", err)
	}
	return file, nil
}

// private is where the token will be, for sandbox.Config.Private: the
// file named, or else the directory of the default ones, since the port
// is not known before the server listens. None without --ahp-listen.
func (a *ahpFlags) private() []string {
	if a.listen == "" {
		return nil
	}
	if a.tokenFile != "" {
		return []string{a.tokenFile}
	}
	if dir, err := ahp.TokenDir(); err == nil {
		return []string{dir}
	}
	return nil // start says there is no place for it
}
