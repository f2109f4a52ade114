package ahp

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/loglimit"
	"github.com/sandboxd/sandboxd/sandbox"
)

// RootURI is the root channel.
const RootURI = "ahp-root://"

// Error codes of the protocol.
const (
	codeParse            = -32700
	codeInvalidRequest   = -32600
	codeMethodNotFound   = -32601
	codeInvalidParams    = -32602
	codeInternal         = -32603
	codeUnsupportedProto = -32005
	codeAuthRequired     = -32007
	codeNotFound         = -32008
	codeAlreadyExists    = -32010
)

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

// maxStrangers bounds the connections without a valid token that are
// answered at a time: each may wait some seconds for its first request.
const maxStrangers = 16

// Envelope carries an action on a channel.
type Envelope struct {
	Channel         string  `json:"channel"`
	Action          Action  `json:"action"`
	ServerSeq       int64   `json:"serverSeq"`
	Origin          *Origin `json:"origin,omitempty"`
	RejectionReason string  `json:"rejectionReason,omitempty"`
	// RawAction, when set, is the action as the client sent it, echoed
	// in place of Action: a rejected action may not decode as one.
	RawAction json.RawMessage `json:"-"`
}

// MarshalJSON writes RawAction as the action when it is set.
func (e Envelope) MarshalJSON() ([]byte, error) {
	type plain Envelope // without this method
	if e.RawAction == nil {
		return json.Marshal(plain(e))
	}
	return json.Marshal(struct {
		plain
		Action json.RawMessage `json:"action"`
	}{plain(e), e.RawAction})
}

// size is what the replay counts an envelope as: its action, and the
// client's id and the reason it carries. A rejection counts its channel
// too: it may name none that exists, in as many bytes as a message holds.
func (e Envelope) size() int {
	n := e.Action.size()
	if e.RawAction != nil {
		n = 64 + len(e.RawAction) + len(e.Channel)
	}
	if e.Origin != nil {
		n += len(e.Origin.ClientID)
	}
	return n + len(e.RejectionReason)
}

// Origin names the client that dispatched an action.
type Origin struct {
	ClientID  string `json:"clientId"`
	ClientSeq int64  `json:"clientSeq"`
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

// NewToken makes a bearer token.
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// TokenFile is where the token of a server listening on addr goes unless
// its user names a file: in TokenDir, named by the port, so that
// instances on two ports do not overwrite each other's.
func TokenFile(addr net.Addr) (string, error) {
	dir, err := TokenDir()
	if err != nil {
		return "", err
	}
	port := 0
	if t, ok := addr.(*net.TCPAddr); ok {
		port = t.Port
	}
	return filepath.Join(dir, fmt.Sprintf("ahp-token-%d", port)), nil
}

// URL is the address a client on this host connects to for a server
// listening on addr: one listening on every interface is reached on
// loopback (listening on :: takes IPv4 too).
func URL(addr net.Addr) string {
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return "ws://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port)) + "/"
	}
	return "ws://" + addr.String() + "/"
}

// TokenDir is the directory of TokenFile: sandboxd's in the user's cache
// directory.
func TokenDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		// No shared fallback such as /tmp: another user could read or
		// swap the token there.
		return "", fmt.Errorf("no place for the AHP token (%v): name a token file", err)
	}
	return filepath.Join(dir, "sandboxd"), nil
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

// WriteToken writes token to file, readable by its owner only. The file
// is written beside its final name and renamed over it, so a link planted
// at that name is replaced, not followed; a directory that others may
// write to and that is not sticky is refused, since they could swap the
// file under its readers.
func WriteToken(file, token string) error {
	dir := filepath.Dir(file)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write token %s: %w", file, err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("write token %s: %w", file, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if ok && int(st.Uid) != os.Getuid() && st.Uid != 0 {
		return fmt.Errorf("write token %s: %s belongs to uid %d, not to this user", file, dir, st.Uid)
	}
	// Group-writable is left alone, as for the image's cache: with a
	// private group per user and umask 002 everything a user makes is.
	if fi.Mode().Perm()&0o002 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return fmt.Errorf("write token %s: others may write to %s (mode %v); choose a private directory", file, dir, fi.Mode().Perm())
	}
	tmp, err := os.CreateTemp(dir, ".ahp-token-*")
	if err != nil {
		return fmt.Errorf("write token %s: %w", file, err)
	}
	_, err = tmp.WriteString(token + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), file)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write token %s: %w", file, err)
	}
	return nil
}

// RemoveToken removes file if it still holds token: another instance may
// have written its own there since.
func RemoveToken(file, token string) {
	if b, err := os.ReadFile(file); err == nil && strings.TrimSpace(string(b)) == token {
		os.Remove(file)
	}
}

// Listen serves on addr until ctx ends. It gives the address it listens
// on to ready before it serves anyone; an error from ready ends it. It is
// called once, before the server serves in any other way.
func (s *Server) Listen(ctx context.Context, addr string, ready func(net.Addr) error) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("ahp listen %s: %w", addr, err)
	}
	// The address bound, not the one asked for: with port 0 only this
	// one tells which endpoint a log line is about.
	s.log = s.log.With("ahp", ln.Addr().String())
	if ready != nil {
		if err := ready(ln.Addr()); err != nil {
			ln.Close()
			return err
		}
	}
	// Connections live in ctx: hijacked ones are beyond srv.Close.
	srv := &http.Server{Handler: s, BaseContext: func(net.Listener) context.Context { return ctx }, ReadHeaderTimeout: 10 * time.Second}
	// Every connection that is not upgraded was refused (no upgrade, a
	// foreign Origin, too many strangers): kept alive, it would hold a
	// descriptor and a goroutine for as long as the peer liked.
	srv.SetKeepAlivesEnabled(false)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err = srv.Serve(ln)
	s.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
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

func (s *Server) authorized(r *http.Request) bool {
	// The scheme is case-insensitive (RFC 9110); a header of another
	// scheme leaves the query's token to count.
	got := ""
	if scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		got = strings.TrimSpace(cred)
	}
	if got == "" {
		got = r.URL.Query().Get("token")
	}
	return s.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.Token)) == 1
}

// protectedResources describes, as RFC 9728 metadata, what a client
// without the token needs one for: this endpoint (named by the address it
// was reached on, not by the request's Host, which the client wrote), with
// the token presented as a bearer token in the Authorization header or the
// token query parameter.
func protectedResources(r *http.Request) []map[string]any {
	resource := "ws://localhost/"
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		resource = "ws://" + a.String() + "/"
	}
	return []map[string]any{{
		"resource":                 resource,
		"resource_name":            "sandboxd AHP terminal channel (token in the file sandboxd printed at start)",
		"bearer_methods_supported": []string{"header", "query"},
		"required":                 true,
	}}
}

// ServeHTTP upgrades to WebSocket. A browser origin that is not allowed is
// refused at the handshake; a wrong token gets AuthRequired to its first
// request and the connection closes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	stranger := !s.authorized(r)
	if stranger {
		defer s.strangers.Add(-1)
		if s.strangers.Add(1) > maxStrangers {
			// Refused before the upgrade: a WebSocket close would wait
			// up to 5 s for the peer's answer, a connection held for
			// each of a flood of them.
			w.Header().Set("Retry-After", "10")
			http.Error(w, "too many connections without a valid token are waiting; try again later", http.StatusServiceUnavailable)
			return
		}
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: s.cfg.Origins})
	if err != nil {
		if n, ok := s.refusals.Allow(time.Now()); ok {
			s.log.Warn("ahp handshake refused", "remote", r.RemoteAddr, "origin", r.Header.Get("Origin"), "err", err, "not_logged", n)
		}
		return
	}
	ws.SetReadLimit(8 << 20)
	ctx := r.Context()
	if stranger {
		if n, ok := s.refusals.Allow(time.Now()); ok {
			s.log.Warn("ahp connection without a valid token", "remote", r.RemoteAddr, "not_logged", n)
		}
		// It gets one small request's time to learn why, not a
		// connection kept open by saying nothing, nor 8 MiB of memory.
		ws.SetReadLimit(64 << 10)
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, data, err := ws.Read(ctx)
		if err == nil {
			var m struct {
				ID json.RawMessage `json:"id"`
			}
			json.Unmarshal(data, &m)
			if len(m.ID) > 0 {
				b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": requestID(m.ID), "error": map[string]any{"code": codeAuthRequired, "message": "authentication required: present the token sandboxd wrote at start", "data": map[string]any{"resources": protectedResources(r)}}})
				ws.Write(ctx, websocket.MessageText, b)
			}
		}
		ws.Close(websocket.StatusPolicyViolation, "authentication required")
		return
	}
	c := newConn(ctx, s, ws)
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	c.run()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// emit applies an action to its channel's state, numbers it and sends it to
// every subscriber, all under one lock, so every client sees the same
// actions in the same order.
func (s *Server) emit(channel string, a Action, origin *Origin) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.emitLocked(channel, a, origin)
}

func (s *Server) emitLocked(channel string, a Action, origin *Origin) {
	if channel == RootURI {
		s.root = ReduceRoot(s.root, a)
	} else if t, ok := s.terms[channel]; ok {
		switch a.Type {
		case "terminal/data":
			t.appendData(a.Data, s.cfg.MaxContent)
		default:
			// Only what changes the content needs the data before it in
			// place: folding it for every other action (the input of
			// each key) copied the last content part, up to the cap,
			// under the server's lock.
			switch a.Type {
			case "terminal/commandExecuted", "terminal/commandFinished", "terminal/cleared":
				t.fold(s.cfg.MaxContent)
			}
			reduceTerminal(&t.state, a)
			if a.Type == "terminal/commandExecuted" {
				TrimContent(&t.state, s.cfg.MaxContent)
			}
		}
	} else {
		return
	}
	s.seq++
	s.publishLocked(Envelope{Channel: channel, Action: a, ServerSeq: s.seq, Origin: origin})
}

// rejectLocked numbers a client's action that did not take effect and
// echoes it with the reason, as the action it sent, to that client alone:
// it drops its optimistic copy. The others saw nothing applied and have
// nothing to revert; sending them what a client made up, which may not
// even decode as an action, would only let it break them. A reconnect of
// the same client replays it. s.mu must be held.
func (s *Server) rejectLocked(from *conn, channel string, raw json.RawMessage, origin *Origin, reason string) {
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	s.seq++
	env := Envelope{Channel: channel, RawAction: raw, ServerSeq: s.seq, Origin: origin, RejectionReason: reason}
	s.keepLocked(env)
	from.hold() // the echo leaves from the client's reader
	from.send(notification("action", env))
}

// publishLocked keeps env for replay and sends it to the channel's
// subscribers. s.mu must be held.
func (s *Server) publishLocked(env Envelope) {
	s.keepLocked(env)
	var msg []byte
	for c := range s.conns {
		if c.subscribed(env.Channel) {
			if msg == nil {
				msg = notification("action", env)
			}
			c.send(msg)
		}
	}
}

// keepLocked keeps env for replay, within the replay's bounds. s.mu must
// be held.
func (s *Server) keepLocked(env Envelope) {
	s.replay = append(s.replay, env)
	s.replayBytes += env.size()
	if len(s.replay) > s.cfg.ReplayActions || s.replayBytes > s.cfg.ReplayBytes {
		// Drop at least a quarter, so the copy is paid rarely; a reconnect
		// from before what is kept gets snapshots.
		drop, quarter := 0, len(s.replay)/4
		for drop < len(s.replay)-1 && (drop < quarter || len(s.replay)-drop > s.cfg.ReplayActions || s.replayBytes > s.cfg.ReplayBytes) {
			s.replayBytes -= s.replay[drop].size()
			drop++
		}
		s.replay = slices.Delete(s.replay, 0, drop)
	}
}

// disposedBit returns where in s.disposed the bit of uri is.
func (s *Server) disposedBit(uri string) (word int, bit uint64) {
	h := maphash.String(s.seed, uri) % uint64(64*len(s.disposed))
	return int(h / 64), 1 << (h % 64)
}

// disposedLocked reports whether a terminal under uri may have been
// disposed. s.mu must be held.
func (s *Server) disposedLocked(uri string) bool {
	w, b := s.disposedBit(uri)
	return s.disposed[w]&b != 0
}

// removeLocked takes a terminal out of the list and ends the subscriptions
// to it. s.mu must be held.
func (s *Server) removeLocked(t *terminal) {
	delete(s.terms, t.uri)
	for c := range s.conns {
		c.mu.Lock()
		delete(c.subs, t.uri)
		c.mu.Unlock()
	}
	w, b := s.disposedBit(t.uri)
	s.disposed[w] |= b
	s.terminalsChangedLocked()
}

// listInterval is the least time between two lists of the terminals that
// title or claim changes publish: a program setting its title in a loop
// would otherwise send every root subscriber the whole list per change.
const listInterval = 200 * time.Millisecond

// listedChangedLocked publishes the terminal catalogue after a title or
// claim changed: at once when none went out for listInterval, else once
// that has passed, with whatever changed meanwhile. s.mu must be held.
func (s *Server) listedChangedLocked() {
	if s.listDue {
		return
	}
	wait := listInterval - time.Since(s.listedAt)
	if wait <= 0 {
		s.terminalsChangedLocked()
		return
	}
	s.listDue = true
	s.listTimer = time.AfterFunc(wait, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.listDue && !s.closing {
			s.terminalsChangedLocked()
		}
	})
}

// terminalsChanged publishes the terminal catalogue. s.mu must be held.
func (s *Server) terminalsChangedLocked() {
	s.listDue, s.listedAt = false, time.Now()
	list := make([]TerminalInfo, 0, len(s.terms))
	for uri, t := range s.terms {
		if t.t == nil {
			continue // still starting
		}
		list = append(list, TerminalInfo{Resource: uri, Title: t.state.Title, Claim: t.state.Claim, ExitCode: t.state.ExitCode})
	}
	slices.SortFunc(list, func(a, b TerminalInfo) int { return strings.Compare(a.Resource, b.Resource) })
	s.emitLocked(RootURI, Action{Type: "root/terminalsChanged", Terminals: list}, nil)
}

// servedLocked reports whether channel is one a client can subscribe to.
// s.mu must be held.
func (s *Server) servedLocked(channel string) bool {
	t, ok := s.terms[channel]
	return channel == RootURI || ok && t.t != nil
}

// snapshot is a channel's state as a subscription starts from it.
type snapshot struct {
	Resource string `json:"resource"`
	State    any    `json:"state"`
	FromSeq  int64  `json:"fromSeq"`
	// size is about what the state holds.
	size int
}

// snapshotLocked returns a channel's state, with its own copy of what the
// server changes in place, so that it can be encoded after the lock is
// let go. s.mu must be held.
func (s *Server) snapshotLocked(channel string) (snapshot, bool) {
	if !s.servedLocked(channel) {
		return snapshot{}, false
	}
	snap := snapshot{Resource: channel, FromSeq: s.seq}
	if channel == RootURI {
		root := s.root
		root.Terminals = slices.Clone(root.Terminals)
		snap.State = root
		for _, t := range root.Terminals {
			snap.size += len(t.Resource) + len(t.Title) + len(t.Claim.ClientID) + len(t.Claim.Session) + PartOverhead
		}
	} else {
		t := s.terms[channel]
		t.fold(s.cfg.MaxContent)
		state := t.state
		state.Content = slices.Clone(state.Content)
		snap.State = state
		for _, p := range state.Content {
			snap.size += partSize(p)
		}
	}
	return snap, true
}

func notification(method string, params any) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
	return b
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
