package ahp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/internal/loglimit"
	"github.com/sandboxd/sandboxd/sandbox"
)

// RootURI is the root channel.
const RootURI = "ahp-root://"

// SessionFor returns the session whose container a terminal with working
// directory dir runs in.
type SessionFor func(ctx context.Context, dir string) (*sandbox.Session, error)

// Config configures a Server.
type Config struct {
	// Token is the bearer token every connection must present, in an
	// Authorization header or a token query parameter.
	Token string
	// Origins are the browser origins allowed besides the server's own
	// host, as host patterns (e.g. "localhost:3000").
	Origins []string
	// MaxContent bounds the content a terminal's state holds, in bytes.
	MaxContent int
	// ReplayActions and ReplayBytes bound the recent actions reconnect can
	// replay, in number and in bytes of terminal data.
	ReplayActions int
	ReplayBytes   int
	// Backlog bounds the bytes of messages queued for one client; a client
	// further behind is disconnected, and its reconnect gets what it
	// missed by replay or snapshots. Answers to its own requests do not
	// count against it, but while more than Backlog of them wait, its
	// next request is not read.
	Backlog int
	// WriteTimeout bounds the writing of one message to a client (30 s by
	// default); a client that stays connected but reads too little to
	// take one in time is disconnected.
	WriteTimeout time.Duration
	// ReadTimeout bounds the reading of one message once it has begun (30
	// s by default, and 1 s more for each 256 KiB that arrives): a client
	// that stops part-way through a message is disconnected rather than
	// left holding what it sent.
	ReadTimeout time.Duration
	// Workspace is the default working directory of new terminals.
	Workspace string
	Sessions  SessionFor
}

// Server serves the AHP terminal channel over WebSocket.
type Server struct {
	cfg Config
	log *slog.Logger
	ctx context.Context
	// refusals keeps a flood of refused connections from flooding the
	// log.
	refusals loglimit.Limit

	mu     sync.Mutex
	seq    int64
	root   RootState
	terms  map[string]*terminal
	conns  map[*conn]struct{}
	replay []Envelope
	// replayBytes is what the actions in replay hold (Envelope.size).
	replayBytes int
	// disposed has a bit set, by a hash of its URI, for each terminal
	// disposed: see reconnectLocked. Bits, not URIs, so that a client
	// making and disposing terminals without end grows nothing; a URI
	// that shares a bit with a disposed one costs a needless snapshot,
	// never a wrong replay.
	disposed [1024]uint64
	seed     maphash.Seed
	// closing is set once Close has begun: no terminal is made after.
	closing bool
	// wg counts the terminals being made, and the goroutines of those
	// made. It is added to under mu, before closing is set or while the
	// terminal's own count is held: never from zero while Close waits.
	wg sync.WaitGroup
	// listedAt is when the terminal catalogue last went out; listDue
	// says one is to go out (listedChangedLocked).
	listedAt  time.Time
	listDue   bool
	listTimer *time.Timer
	// strangers counts connections without a valid token still being
	// told so; past maxStrangers more are closed at once.
	strangers atomic.Int32
}

// NewServer returns a server; ctx bounds the terminals it runs.
func NewServer(ctx context.Context, cfg Config, log *slog.Logger) *Server {
	if cfg.MaxContent <= 0 {
		cfg.MaxContent = 1 << 20
	}
	if cfg.ReplayActions <= 0 {
		cfg.ReplayActions = 4096
	}
	if cfg.ReplayBytes <= 0 {
		cfg.ReplayBytes = 8 << 20
	}
	if cfg.Backlog <= 0 {
		cfg.Backlog = 16 << 20
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = 30 * time.Second
	}
	return &Server{
		// Numbered from the time it starts, so that a client of an
		// earlier run that reconnects is given snapshots, never a replay
		// of this run's actions as if they were what it missed.
		seq:   time.Now().UnixMicro(),
		cfg:   cfg,
		log:   log,
		ctx:   ctx,
		root:  RootState{Agents: json.RawMessage("[]")},
		terms: make(map[string]*terminal),
		conns: make(map[*conn]struct{}),
		seed:  maphash.MakeSeed(),
	}
}

// CheckMaxContent refuses a bound on a terminal's content (Config.MaxContent)
// a server should not keep: the content is held in memory per terminal;
// below 1 KiB a client that subscribes is shown next to nothing, and past
// 1 GiB it bounds nothing.
func CheckMaxContent(n int64) error {
	if n < 1<<10 || n > 1<<30 {
		return errors.New("must be from 1KiB to 1GiB")
	}
	return nil
}

// Close disposes every terminal, also those being made, and refuses to
// make more.
func (s *Server) Close() {
	s.mu.Lock()
	s.closing = true
	if s.listTimer != nil {
		s.listTimer.Stop()
	}
	terms := make([]*terminal, 0, len(s.terms))
	for _, t := range s.terms {
		terms = append(terms, t)
	}
	s.mu.Unlock()
	// Together: each may wait out its processes' grace period.
	var wg sync.WaitGroup
	for _, t := range terms {
		wg.Go(func() { t.dispose(context.WithoutCancel(s.ctx)) })
	}
	wg.Wait()
	s.wg.Wait()
}

// pathOf turns a file URI (or a plain absolute path) into a path.
func pathOf(uri string) (string, error) {
	if strings.HasPrefix(uri, "/") {
		return filepath.Clean(uri), nil
	}
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "file" || !filepath.IsAbs(u.Path) {
		return "", fmt.Errorf("cwd %.200q is not a file URI with an absolute path", uri)
	}
	return filepath.Clean(u.Path), nil
}

func fileURI(path string) string { return (&url.URL{Scheme: "file", Path: path}).String() }
